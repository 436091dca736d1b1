"""Out of memory (hone.train.oom): an injected allocation failure of the step at micro-batch 8
makes the run go on at micro-batch 4 with double accumulation, ending with the parameters of a
run configured that way from the start; a failure that consumed the donated state resumes from
the newest checkpoint; a micro-batch of 1 gives up with a message naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest

import hone.train.build as build
from hone.config import SFTConfig, load_config
from hone.recipes.sft import run_sft
from hone.train.oom import OutOfMemory

ROOT = Path(__file__).resolve().parents[2]
BASE = ["train.max_steps=6", "train.batch_size=8", "log.sinks=[jsonl]", "data.max_records=64",
        "data.eval_path=null", "checkpoint.async_save=false", "train.schedule=constant"]


def oom_error():
    return jax.errors.JaxRuntimeError(
        "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 123456789 bytes.")


def inject(monkeypatch, *, fits: int, at_step: int = 1, consume: bool = False):
    """Steps jitted for micro-batches above `fits` rows raise an out-of-memory error from
    step `at_step` on (after deleting the donated state's arrays when `consume`)."""
    real = build.make_train_step
    seen = {"accum": []}

    def make_train_step(*args, accum, **kwargs):
        step = real(*args, accum=accum, **kwargs)
        seen["accum"].append(accum)

        def maybe_fail(state, frozen, batch, aux=None):
            rows = batch["tokens"].shape[0] // accum
            if rows > fits and int(state["step"]) + 1 >= at_step:
                if consume:
                    for x in jax.tree.leaves(state):
                        x.delete()
                raise oom_error()
            return step(state, frozen, batch, aux)

        return maybe_fail

    monkeypatch.setattr(build, "make_train_step", make_train_step)
    return seen


def run(tmp_path, name, *overrides):
    cfg = load_config(SFTConfig, str(ROOT / "configs/tiny/sft.yaml"),
                      [f"run_dir={tmp_path / name}", *BASE, *overrides])
    _, state = run_sft(cfg, log=lambda *a: None)
    rows = [json.loads(l) for l in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
    return jax.device_get(state["params"]), rows


def assert_same_params(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def test_oom_at_micro_batch_8_ends_like_micro_batch_4_with_double_accumulation(
        tmp_path, monkeypatch, capfd):
    planned, planned_rows = run(tmp_path, "planned", "train.grad_accum=2")
    seen = inject(monkeypatch, fits=4)
    got, rows = run(tmp_path, "oom")
    assert seen["accum"] == [1, 2]  # rebuilt once, with twice the accumulation
    assert_same_params(got, planned)
    assert [r["loss"] for r in rows if "loss" in r] == [r["loss"] for r in planned_rows]
    assert {"step": 1, "oom/grad_accum": 2, "oom/micro_batch": 4} in rows
    assert "set train.grad_accum = 2 to start there" in capfd.readouterr().err


def test_oom_that_consumed_the_state_resumes_from_the_newest_checkpoint(tmp_path, monkeypatch,
                                                                       capfd):
    # Steps 1-2 at micro-batch 8 and 3-6 at 4 is a different run; compare to that.
    run(tmp_path, "mixed", "train.max_steps=2", "checkpoint.every_steps=2")
    mixed, _ = run(tmp_path, "mixed", "train.grad_accum=2")
    seen = inject(monkeypatch, fits=4, at_step=3, consume=True)
    got, rows = run(tmp_path, "oom", "checkpoint.every_steps=2")
    assert seen["accum"][-1] == 2
    assert_same_params(got, mixed)
    assert "continuing from the checkpoint of step 2" in capfd.readouterr().err


def test_no_checkpoint_to_return_to_names_grad_accum(tmp_path, monkeypatch):
    inject(monkeypatch, fits=4, consume=True)
    with pytest.raises(OutOfMemory, match="train.grad_accum = 2"):
        run(tmp_path, "oom", "checkpoint.every_steps=0")


def test_gives_up_at_one_example_per_micro_batch(tmp_path, monkeypatch):
    inject(monkeypatch, fits=0)
    with pytest.raises(OutOfMemory, match="already one example per device") as e:
        run(tmp_path, "oom")
    assert e.value.key == "train.batch_size"
