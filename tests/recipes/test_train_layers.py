"""model.train_layers: only the top N blocks (and what sits above them) train; the embedding and
the lower blocks come out of a run bit for bit as they went in."""

from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from hone.config import RewardConfig, SFTConfig, load_config
from hone.errors import InputError
from hone.recipes.reward import run_reward
from hone.train.build import build_model, build_reward_model
from hone.train.state import flatten
from hone.weights.loading import load_model

ROOT = Path(__file__).resolve().parents[2]


def trained_paths(model, trainable) -> set[str]:
    _, params, _ = nnx.split(model, trainable, ...)
    return set(flatten(params))


def test_filter_picks_the_top_blocks_and_what_sits_above_them():
    cfg = load_config(SFTConfig, None, ["model.source=tiny", "model.train_layers=1"])
    model, trainable = build_model(cfg)
    paths = trained_paths(model, trainable)
    assert paths and all(p.startswith(("layers/1/", "final_norm/")) for p in paths), paths
    every = trained_paths(model, nnx.Param)
    assert {p for p in every if p.startswith("layers/1/") or p.startswith("final_norm/")} == paths


def test_reward_head_trains_with_adapters_in_the_top_block_only():
    cfg = load_config(RewardConfig, None, ["model.source=tiny", "model.train_layers=1",
                                           "model.lora.rank=4"])
    model, trainable = build_reward_model(cfg)
    paths = trained_paths(model, trainable)
    assert "head/kernel" in paths
    body = paths - {"head/kernel"}
    assert body and all(p.startswith("backbone/layers/1/") and "/lora/" in p for p in body), body


def test_more_layers_than_the_model_has_is_an_input_error():
    cfg = load_config(SFTConfig, None, ["model.source=tiny", "model.train_layers=3"])
    with pytest.raises(InputError, match="model.train_layers"):
        build_model(cfg)


def test_reward_run_leaves_the_frozen_blocks_unchanged(tmp_path):
    cfg = load_config(RewardConfig, str(ROOT / "configs/tiny/reward.yaml"), [
        f"run_dir={tmp_path}", "log.sinks=[jsonl]", "model.train_layers=1",
        "train.max_steps=3", "train.eval_every=3", "data.max_records=32"])
    model, _ = run_reward(cfg, log=lambda s: None)
    before = flatten(nnx.state(load_model("tiny"), nnx.Param))
    after = flatten(nnx.state(model.backbone, nnx.Param))
    for path, value in before.items():
        same = np.array_equal(np.asarray(value), np.asarray(jax.device_get(after[path])))
        assert same == (not path.startswith(("layers/1/", "final_norm/"))), path


def test_ppo_value_head_trains_beside_the_top_block():
    from hone.config import PPOConfig
    from hone.rl.critic import build_ppo_model
    cfg = load_config(PPOConfig, str(ROOT / "configs/tiny/ppo.yaml"),
                      ["model.train_layers=1", "model.lora.rank=0"])
    model, trainable, _ = build_ppo_model(cfg)
    paths = trained_paths(model, trainable)
    assert any("value_head" in p for p in paths)
    assert not any("embedder" in p or "/layers/0/" in p for p in paths), paths
    assert any("/layers/1/" in p for p in paths)
