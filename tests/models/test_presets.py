"""Full-size presets: shapes checked without allocating (jax.eval_shape / torch meta device)."""

import jax
import pytest
import torch
import transformers
from flax import nnx

from hone.models.config import PRESETS, ModelConfig
from hone.models.transformer import Transformer
from hone.weights.hf_config import config_from_hf, config_to_hf


def hone_count(cfg: ModelConfig) -> int:
    abstract = nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))


def transformers_count(cfg: ModelConfig) -> int:
    d = config_to_hf(cfg)
    config = transformers.AutoConfig.for_model(d.pop("model_type"), **d)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_parameter_count_matches_transformers(name):
    cfg = PRESETS[name]
    n = hone_count(cfg)
    assert n == cfg.num_params()
    assert n == transformers_count(cfg)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_config_survives_hf_round_trip(name):
    cfg = PRESETS[name]
    assert config_from_hf(config_to_hf(cfg)) == cfg


def test_published_sizes():
    # Rounded sizes as the model cards state them (embeddings included).
    billions = {"llama3.2-1b": 1.24, "llama3.1-8b": 8.03, "qwen2.5-0.5b": 0.49,
                "qwen3-0.6b": 0.60, "gemma2-2b": 2.61, "gemma3-270m": 0.268,
                "smollm2-135m": 0.135, "smollm2-1.7b": 1.71}
    for name, b in billions.items():
        assert abs(PRESETS[name].num_params() / 1e9 - b) / b < 0.01, name


def test_moe_published_sizes():
    # (total, active) billions as the model cards state them: MFU counts the active ones.
    billions = {"qwen3-30b-a3b": (30.5, 3.3), "mixtral-8x7b": (46.7, 12.9),
                "qwen1.5-moe-a2.7b": (14.3, 2.7)}
    for name, (total, active) in billions.items():
        cfg = PRESETS[name]
        assert abs(cfg.num_params() / 1e9 - total) / total < 0.01, name
        assert abs(cfg.num_params(active=True) / 1e9 - active) / active < 0.02, name
        assert cfg.matmul_params() == cfg.num_params(active=True) - cfg.vocab_size * cfg.hidden_size
