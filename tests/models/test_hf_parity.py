"""hone's transformer against transformers' reference implementation, family by family.

Each case builds a small random model with transformers (GQA, odd head counts, a sequence longer
than the sliding window where there is one), saves it with save_pretrained, loads it with
hone.load_model and compares fp32 logits on a padded batch (left- and right-padded rows).
Every weight, norms and biases included, is randomised so no term can hide behind a zero.
"""

import numpy as np
import pytest
import torch
import transformers

import hone
from hone.models.hf import load_hf

TOL = 1e-4  # fixed; never loosened

COMMON = dict(vocab_size=97, hidden_size=48, intermediate_size=80, num_hidden_layers=3,
              num_attention_heads=3, num_key_value_heads=1, head_dim=16,
              max_position_embeddings=64)
SLIDING = ["sliding_attention", "full_attention", "sliding_attention"]

CASES = {
    "llama": (transformers.LlamaConfig, dict(
        rope_theta=500000.0, tie_word_embeddings=False,
        rope_scaling=dict(rope_type="llama3", factor=4.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8))),
    "llama-tied": (transformers.LlamaConfig, dict(tie_word_embeddings=True, rope_theta=1e5)),
    "qwen2": (transformers.Qwen2Config, dict(rope_theta=1e6, tie_word_embeddings=False)),
    "qwen3": (transformers.Qwen3Config, dict(rope_theta=1e6, tie_word_embeddings=True)),
    "gemma": (transformers.GemmaConfig, dict()),
    "gemma2": (transformers.Gemma2Config, dict(sliding_window=4, layer_types=SLIDING,
                                               query_pre_attn_scalar=24)),
    "gemma3_text": (transformers.Gemma3TextConfig, dict(
        sliding_window=4, layer_types=SLIDING, query_pre_attn_scalar=24,
        rope_scaling=dict(rope_type="linear", factor=8.0))),
}


def randomize(model: torch.nn.Module, seed: int = 0) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.2)


def batch(seed: int = 0, b: int = 3, t: int = 12):
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, COMMON["vocab_size"], (b, t)).astype(np.int32)
    mask = np.ones((b, t), np.int32)
    mask[1, -4:] = 0  # right padding
    mask[2, :3] = 0  # left padding
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)
    return tokens, mask, positions


def hf_model(name: str, tmp_path) -> tuple[torch.nn.Module, str]:
    cls, extra = CASES[name]
    config = cls(**COMMON, **extra)
    config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize(model)
    model.eval()
    folder = str(tmp_path / name)
    model.save_pretrained(folder)
    return model, folder


def hf_logits(model, tokens, mask, positions) -> np.ndarray:
    with torch.no_grad():
        out = model(input_ids=torch.tensor(tokens, dtype=torch.long),
                    attention_mask=torch.tensor(mask),
                    position_ids=torch.tensor(positions, dtype=torch.long))
    return out.logits.float().numpy()


def max_diff_on_real_tokens(a, b, mask) -> float:
    real = mask.astype(bool)
    return float(np.abs(a[real] - b[real]).max())


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(name, tmp_path):
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch()
    model = hone.load_model(folder, dtype="float32")
    ours = np.asarray(model(tokens, attention_mask=mask))  # default positions = cumsum - 1
    theirs = hf_logits(ref, tokens, mask, positions)
    assert max_diff_on_real_tokens(ours, theirs, mask) <= TOL


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2", "gemma3_text"])
def test_save_hf_round_trip(name, tmp_path):
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch(seed=1)
    model = hone.load_model(folder)
    out = hone.save_hf(model, tmp_path / "export")
    reloaded_ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager").eval()
    ours = np.asarray(model(tokens, attention_mask=mask))
    assert max_diff_on_real_tokens(hf_logits(reloaded_ref, tokens, mask, positions), ours,
                                   mask) <= TOL
    again = load_hf(out)
    import jax
    from flax import nnx
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        assert np.array_equal(np.asarray(a), np.asarray(b))
