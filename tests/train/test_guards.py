"""Guards on the tiny SFT preset: non-finite steps are skipped, a non-finite streak and a loss
spike roll back to the newest checkpoint with a lower learning rate, the rollback budget stops
the run, and a run stopped and resumed makes the same decisions.

Faults are injected from the test only: the recipe's loss is wrapped (monkeypatch) to multiply
the loss by a per-row `poison` column, and the train step is wrapped to add that column from a
schedule keyed on (step about to run, rollbacks so far), read from the train state. Keying on
the checkpointed rollback count makes the faults replay identically after a resume.
"""

import json
import os
import signal
from pathlib import Path

import jax
import numpy as np
import pytest

import hone.recipes.sft as sft
from hone.config import SFTConfig, load_config
from hone.train.guards import GuardError
from hone.train.loop import Interrupted

ROOT = Path(__file__).resolve().parents[2]
BASE = ["log.sinks=[jsonl]", "train.max_steps=16", "train.batch_size=4",
        "data.max_records=64", "data.eval_path=null", "checkpoint.every_steps=4",
        "checkpoint.keep=5", "checkpoint.async_save=false"]
NAN = float("nan")


def config(run_dir, *overrides):
    return load_config(SFTConfig, str(ROOT / "configs/tiny/sft.yaml"),
                       [f"run_dir={run_dir}", *BASE, *overrides])


def inject(monkeypatch, faults: dict, stop_at: tuple | None = None):
    """faults: {(step, rollbacks): loss multiplier}; stop_at: (step, rollbacks) at which the
    process signals itself (SIGTERM) once, before running that step."""
    loss_fn, compile_steps = sft.sft_step_loss, sft.compile_steps

    def poisoned_loss(model, mb, normalizer, key, aux=None):
        loss, metrics = loss_fn(model, mb, normalizer, key, aux)
        if "poison" in mb:  # eval batches have none
            loss = loss * mb["poison"][0]
        return loss, metrics

    def wrapped_compile(*args, **kwargs):
        *rest, step, eval_step = compile_steps(*args, **kwargs)
        stop = [stop_at]

        def faulty_step(state, frozen, batch, aux=None):
            at = (int(state["step"]) + 1, int(state["guard"]["rollbacks"]))
            if stop[0] == at:
                stop[0] = None
                os.kill(os.getpid(), signal.SIGTERM)
            rows = jax.tree.leaves(batch)[0].shape[0]
            poison = np.full((rows,), faults.get(at, 1.0), np.float32)
            return step(state, frozen, dict(batch, poison=poison), aux)

        return (*rest, faulty_step, eval_step)

    monkeypatch.setattr(sft, "sft_step_loss", poisoned_loss)
    monkeypatch.setattr(sft, "compile_steps", wrapped_compile)


def rows(run_dir) -> list[dict]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [{k: v for k, v in json.loads(line).items() if k != "tokens_per_s"}
            for line in lines]


def finite(state) -> bool:
    return all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(state["params"]))


def test_isolated_nonfinite_steps_are_skipped(tmp_path, monkeypatch):
    inject(monkeypatch, {(3, 0): NAN, (6, 0): float("inf")})
    _, state = sft.run_sft(config(tmp_path), log=lambda s: None)
    by_step = {r["step"]: r for r in rows(tmp_path)}
    assert [by_step[s]["guard/skipped"] for s in (2, 3, 5, 6, 16)] == [0, 1, 1, 2, 2]
    assert by_step[16]["guard/rollbacks"] == 0 and by_step[16]["guard/lr_scale"] == 1.0
    assert int(state["step"]) == 16 and finite(state)  # skipped steps still count


# Three NaN steps in a row (6-8) trip the streak guard: back to step 4, lr x 0.8. After that
# rollback a 100x loss at step 10 trips the spike guard: back to step 8, lr x 0.8 again.
SCENARIO = {(6, 0): NAN, (7, 0): NAN, (8, 0): NAN, (10, 1): 100.0}
SPIKES = ["guard.spike_factor=3.0", "guard.warmup_steps=2"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The scenario run without a stop: its run folder and final state (shared, it is slow)."""
    run_dir = tmp_path_factory.mktemp("straight")
    with pytest.MonkeyPatch.context() as mp:
        inject(mp, SCENARIO)
        _, state = sft.run_sft(config(run_dir, *SPIKES), log=lambda s: None)
    return run_dir, state


def test_streak_and_spike_roll_back_with_lower_lr(straight):
    run_dir, state = straight
    got = rows(run_dir)
    backs = [(r["step"], r["guard/rollback_to"], r["guard/tripped"]) for r in got
             if "guard/rollback_to" in r]
    assert backs == [(8, 4, 1), (10, 8, 2)]
    last = got[-1]
    assert last["step"] == 16 and last["guard/rollbacks"] == 2 and last["guard/skipped"] == 3
    assert last["guard/lr_scale"] == pytest.approx(0.64)
    assert int(state["step"]) == 16 and finite(state)


def test_rollback_budget_stops_the_run(tmp_path, monkeypatch):
    # The same batches come back after a rollback: a fault in the data trips every time.
    inject(monkeypatch, {(s, r): NAN for s in (6, 7, 8) for r in range(3)})
    with pytest.raises(GuardError, match="after 1 rollbacks"):
        sft.run_sft(config(tmp_path, "guard.max_rollbacks=1"), log=lambda s: None)


# Stopped on checkpoint steps: a signal between them saves an extra checkpoint, which
# becomes the newest one a later rollback returns to.
@pytest.mark.parametrize("stop_at", [(4, 0), (12, 2)], ids=["before-trips", "after-trips"])
def test_stopped_run_replays_the_same_decisions(tmp_path, monkeypatch, stop_at, straight):
    stopped = tmp_path / "stopped"
    inject(monkeypatch, SCENARIO, stop_at=stop_at)
    with pytest.raises(Interrupted):
        sft.run_sft(config(stopped, *SPIKES), log=lambda s: None)
    monkeypatch.undo()
    inject(monkeypatch, SCENARIO)
    sft.run_sft(config(stopped, *SPIKES), log=lambda s: None)
    # As text: NaN losses compare unequal as floats.
    assert list(map(json.dumps, rows(stopped))) == list(map(json.dumps, rows(straight[0])))


@pytest.mark.parametrize("lag", [[], ["grpo.max_staleness=1"]])
def test_kl_overshoot_rolls_back_an_rl_run(lag, tmp_path, monkeypatch):
    """GRPO with guard.max_kl: a logged KL above it (injected into step 5's metrics) rolls the
    run back to the step-4 checkpoint with the learning rate times 0.8, and it ends healthy;
    with rollouts a version behind too (the rollout in flight is dropped, the lag restarts from
    the checkpoint's versions)."""
    import hone.recipes.grpo as grpo
    from hone.config import GRPOConfig
    real_loop = grpo.run_loop

    def run_loop(spec, cfg, run_dir):
        step = spec.train_step

        def overshooting(state, frozen, batch, aux=None):
            at = (int(state["step"]) + 1, int(state["guard"]["rollbacks"]))
            state, metrics = step(state, frozen, batch, aux)
            if at == (5, 0):
                metrics = dict(metrics, kl_sum=metrics["tokens"] * 1e3)
            return state, metrics

        spec.train_step = overshooting
        return real_loop(spec, cfg, run_dir)

    monkeypatch.setattr(grpo, "run_loop", run_loop)
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/grpo.yaml"), [
        f"run_dir={tmp_path}", "log.sinks=[jsonl]", "train.max_steps=7", "train.batch_size=8",
        "checkpoint.every_steps=2", "checkpoint.async_save=false", "data.eval_path=null",
        "guard.max_kl=10", *lag])
    _, state, _ = grpo.run_grpo(cfg, log=lambda s: None)
    got = rows(tmp_path)
    backs = [(r["step"], r["guard/rollback_to"], r["guard/tripped"]) for r in got
             if "guard/rollback_to" in r]
    assert backs == [(5, 4, 4)]  # KL_TRIP
    logged = [r for r in got if "loss" in r]
    assert [r["step"] for r in logged] == [1, 2, 3, 4, 5, 5, 6, 7]
    assert all(r["kl"] < 10 for r in logged if r is not logged[4])
    assert logged[-1]["guard/lr_scale"] == pytest.approx(0.8)
    assert int(state["step"]) == 7 and finite(state)


def test_configured_limits_keep_the_placement_of_the_ones_they_replace():
    """A restored state (or one on a mesh) is committed to its devices, as the step's outputs
    are; limits (or, after a rollback, counters) written into it uncommitted would be another
    input type, and the step would be compiled twice: once for the first call, again for the
    state it returns."""
    from hone.config.schema import GuardSection
    from hone.train.guards import configure, init_state, rollback
    placed = jax.device_put(init_state(), jax.devices()[0])
    state = configure({"guard": placed}, GuardSection(max_skips=7))
    assert int(state["guard"]["limits"]["max_skips"]) == 7
    for key, limit in state["guard"]["limits"].items():
        assert limit.committed and limit.sharding == placed["limits"][key].sharding, key
    rolled = rollback(state, state, GuardSection(), reason=1, step=8, restored_step=4)
    assert int(rolled["guard"]["rollbacks"]) == 1
    assert all(x.committed for x in jax.tree.leaves(rolled["guard"]))
    # A fresh state stays uncommitted, as the arrays beside it are.
    fresh = configure({"guard": init_state()}, GuardSection())
    assert not any(x.committed for x in jax.tree.leaves(fresh))
