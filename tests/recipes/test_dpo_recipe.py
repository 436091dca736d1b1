"""`hone dpo` and `hone reward` end to end on the tiny preset."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers

from hone.cli import main
from hone.config import DPOConfig, RewardConfig, load_config
from hone.export import load_run_model
from hone.recipes.dpo import run_dpo
from hone.recipes.reward import run_reward
from hone.train.reference import reference_mode

ROOT = Path(__file__).resolve().parents[2]
DPO = str(ROOT / "configs/tiny/dpo.yaml")
REWARD = str(ROOT / "configs/tiny/reward.yaml")
QUIET = dict(log=lambda s: None)


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def dpo_config(run_dir, *overrides):
    return load_config(DPOConfig, DPO, [f"run_dir={run_dir}", "log.sinks=[jsonl]", *overrides])


def test_tiny_dpo_raises_held_out_accuracy_and_margin(tmp_path):
    run_dpo(dpo_config(tmp_path), **QUIET)
    last = rows(tmp_path)[-1]
    # At step 0 the policy is the reference: every margin is 0 and accuracy 0. A random tiny
    # model cannot learn arithmetic in 40 steps, so held-out gains are small (measured 0.585);
    # the SmolLM2 run in benchmarks/ is where held-out accuracy must pass 90%.
    assert last["eval_accuracy"] > 0.5 and last["eval_margin"] > 0.0
    assert "kl" in last and "rewards_chosen" in last


def test_tiny_dpo_learns_its_training_pairs(tmp_path):
    run_dpo(dpo_config(tmp_path, "data.max_records=64", "data.eval_path=builtin:arithmetic-pref"),
            **QUIET)
    evals = [r for r in rows(tmp_path) if "eval_accuracy" in r]
    assert evals[-1]["eval_accuracy"] > 0.65  # measured 0.70
    assert evals[-1]["eval_margin"] > evals[0]["eval_margin"] > 0.0


@pytest.mark.parametrize("extra, mode, extra_weights", [
    ([], "copy", True),
    (["model.lora.rank=4"], "adapters_off", False),
    (["dpo.reference=precomputed"], "precomputed", False),
    (["model.lora.rank=4", "dpo.reference=precomputed"], "precomputed", False),
])
def test_reference_modes_start_at_log_two(tmp_path, extra, mode, extra_weights):
    cfg = dpo_config(tmp_path, "train.max_steps=2", "data.eval_path=null", *extra)
    assert reference_mode(cfg) == mode
    _, _, ref_bytes = run_dpo(cfg, **QUIET)
    # Before the first update the policy equals its reference: d = 0 and the loss is log 2.
    assert rows(tmp_path)[0]["loss"] == pytest.approx(math.log(2.0), abs=1e-6)
    assert (ref_bytes > 0) == extra_weights  # switching adapters off copies no weights
    if mode == "precomputed":
        assert (tmp_path / "reference_logps.npz").exists()


@pytest.mark.parametrize("loss_type", ["simpo", "orpo", "ipo", "hinge", "robust"])
def test_other_losses_train_and_reference_free_ones_build_no_reference(tmp_path, loss_type):
    extra = ["dpo.label_smoothing=0.1"] if loss_type == "robust" else []
    cfg = dpo_config(tmp_path, "train.max_steps=6", "data.eval_path=null",
                     f"dpo.loss_type={loss_type}", *extra)
    _, _, ref_bytes = run_dpo(cfg, **QUIET)
    if loss_type in ("simpo", "orpo"):
        assert reference_mode(cfg) is None and ref_bytes == 0
    losses = [r["loss"] for r in rows(tmp_path)]
    assert all(np.isfinite(losses))


def test_reward_model_learns_and_exports_to_transformers(tmp_path):
    run = tmp_path / "run"
    # Scored on its own training pairs: a random tiny backbone cannot learn arithmetic that
    # generalises in 40 steps; the SmolLM2 run in benchmarks/ measures held-out accuracy.
    # All 64 of them (train.eval_batches=0), not the config's first 32.
    cfg = load_config(RewardConfig, REWARD, [f"run_dir={run}", "log.sinks=[jsonl]",
                                             "data.max_records=64", "train.eval_batches=0",
                                             "data.eval_path=builtin:arithmetic-pref"])
    run_reward(cfg, **QUIET)
    last = rows(run)[-1]
    print("reward eval accuracy", last["eval_accuracy"])
    assert last["eval_accuracy"] > 0.65
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "rm")]) == 0
    model, tok, _ = load_run_model(run)
    texts = ["3 + 4 = 7. The answer is 7.", "Ben has 5 coins.", "12 - 2"]
    ids = [tok.encode(t) for t in texts]
    width = max(map(len, ids))
    pad = tok.pad_id
    tokens = np.array([i + [pad] * (width - len(i)) for i in ids], np.int32)
    mask = np.array([[1] * len(i) + [0] * (width - len(i)) for i in ids], np.int32)
    ours = np.asarray(model(tokens, attention_mask=mask))
    ref = transformers.AutoModelForSequenceClassification.from_pretrained(
        str(tmp_path / "rm"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = ref(input_ids=torch.tensor(tokens, dtype=torch.long),
                     attention_mask=torch.tensor(mask)).logits[:, 0].numpy()
    assert np.abs(ours - theirs).max() <= 1e-4


def test_gradient_accumulation_keeps_each_chosen_row_with_its_rejected_row(tmp_path):
    """8 pairs as 1 x 8 and as 4 x 2 micro-batches: the same losses (pair_split hands each
    micro-batch whole pairs; a plain row split would pair chosen rows with chosen rows), and
    the same in both batch layouts (a shared prompt row per pair, or two rows)."""
    runs = {}
    for accum, shared in ((1, True), (4, True), (4, False)):
        run = tmp_path / f"{accum}-{shared}"
        run_dpo(dpo_config(run, "train.max_steps=3", "train.eval_every=0",
                           f"train.grad_accum={accum}", "checkpoint.every_steps=0",
                           f"dpo.shared_prompt={str(shared).lower()}"), **QUIET)
        runs[accum, shared] = [r["loss"] for r in rows(run) if "loss" in r]
    np.testing.assert_allclose(runs[4, True], runs[1, True], rtol=1e-5)
    np.testing.assert_allclose(runs[4, False], runs[1, True], rtol=1e-5)
