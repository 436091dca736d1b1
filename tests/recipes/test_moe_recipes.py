"""The tiny mixture-of-experts configs (configs/tiny/moe_*.yaml) learn, and an MoE run stopped
by SIGTERM resumes exactly. Nothing of a routed MLP lives outside the checkpoint: its router
statistics are an nnx intermediate each forward pass records and the train step pops
(hone/models/transformer.py), so the parameters, optimizer state and data position that every
run saves are the whole state. (configs/tiny/moe_sft.yaml learns in tests/parallel's MoE
mesh test.)"""

import json
from pathlib import Path

import numpy as np
import pytest

from hone.config import DPOConfig, GRPOConfig, load_config
from hone.recipes import dpo as dpo_recipe
from hone.recipes.dpo import run_dpo
from hone.recipes.grpo import run_grpo
from hone.train.loop import Interrupted
from preempt import stop_on_batch

ROOT = Path(__file__).resolve().parents[2]
QUIET = dict(log=lambda s: None)
# DPO on 16 training pairs (two batches), 8 steps: the loss of pairs seen before falls.
DPO = ["data.max_records=16", "data.eval_path=null", "train.max_steps=8",
       "checkpoint.every_steps=100"]


def config(cls, name, run_dir, *overrides):
    return load_config(cls, str(ROOT / f"configs/tiny/{name}.yaml"),
                       [f"run_dir={run_dir}", "log.sinks=[jsonl]", *overrides])


def rows(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_tiny_moe_grpo_learns_the_length_reward(tmp_path):
    """As configs/tiny/grpo.yaml's test: the random model writes all 16 tokens; 6 steps of
    the length penalty teach it to stop earlier (held-out, greedy)."""
    cfg = config(GRPOConfig, "moe_grpo", tmp_path, "train.max_steps=6", "train.eval_every=6",
                 "grpo.eval_prompts=8", "checkpoint.every_steps=100")
    run_grpo(cfg, **QUIET)
    start, *m = rows(tmp_path)
    assert start["eval_completion_len"] == 16 and len(m) == 6
    # measured: length 16 -> 6.6, reward -0.16 -> -0.07
    assert m[-1]["eval_completion_len"] < 12 and m[-1]["eval_reward"] > start["eval_reward"] + 0.03
    assert max(r["sampler_gap"] for r in m) < 1e-5  # sampler and trainer route alike
    assert all(r["moe/dropped"] == 0 and r["moe/aux_loss"] > 0 for r in m)


def test_tiny_moe_dpo_learns_and_resumes_exactly_after_sigterm(tmp_path, monkeypatch):
    """8 straight steps: the loss falls from log 2 (plus the router losses). The same run
    stopped by SIGTERM during step 4 (step 4 finishes, saves, stops) and run again: the same
    losses and router metrics, bit for bit, and the same final weights."""
    _, straight, _ = run_dpo(config(DPOConfig, "moe_dpo", tmp_path / "straight", *DPO),
                             **QUIET)
    want = rows(tmp_path / "straight")
    losses = [r["loss"] for r in want]
    assert len(losses) == 8
    # measured 0.71 -> 0.55-0.60; log 2 = 0.693 plus 0.01 x aux (about 2) + 0.001 x z
    assert np.mean(losses[-3:]) < losses[0] - 0.07
    assert want[-1]["accuracy"] == 1.0

    cfg = config(DPOConfig, "moe_dpo", tmp_path / "stopped", *DPO)
    stop_on_batch(monkeypatch, dpo_recipe, at=4)
    with pytest.raises(Interrupted):
        run_dpo(cfg, **QUIET)
    assert (tmp_path / "stopped" / "checkpoints" / "4").exists()
    monkeypatch.undo()
    _, resumed, _ = run_dpo(cfg, **QUIET)
    keys = ("step", "loss", "moe/aux_loss", "moe/z_loss", "moe/load_max", "accuracy")
    got = [{k: r[k] for k in keys} for r in rows(tmp_path / "stopped")]
    assert got == [{k: r[k] for k in keys} for r in want]
    for k in straight["params"]:
        assert np.array_equal(np.asarray(straight["params"][k]),
                              np.asarray(resumed["params"][k])), k
