"""hone.train.lagged: the rollout of step t reads policy version max(t - k, 0) exactly, runs
while the update does, is run again after a failure on its thread, ends a hang with a clear
error, what a checkpoint needs (the k versions, the data position before the rollout in
flight) round-trips, and a checkpoint of another lag is refused before restoring."""

import json
import threading
import time

import jax.numpy as jnp
import pytest

from hone.errors import InputError
from hone.train.lagged import (LAGGED_KEY, LaggedRollouts, RolloutTimeout, check_saved_lag,
                               saved_lag)


class Data:
    """A data iterator with a position: batch i is {"i": i}."""

    def __init__(self):
        self.i = 0

    def next(self):
        self.i += 1
        return {"i": self.i - 1}

    def get_state(self):
        return {"i": self.i}

    def set_state(self, state):
        self.i = state["i"]


def run(lag: int, steps: int, prepare, data=None, start=0, saved=None, until=None, **kw):
    """The loop's calls with an 'update' that adds 1 to the version, for a run of `steps`
    stopped after `until` (a rollout in flight then): -> (rows of each step, the lag object)."""
    data = data or Data()
    lagged = LaggedRollouts(prepare, data, lag, log=lambda m: None, **kw)
    state = {"params": {"w": jnp.asarray(float(start))}}
    lagged.start(state, start, saved)
    out = []
    for step in range(start, steps if until is None else until):
        rows, host = lagged.rows(state, step)
        lagged.launch(state, step, steps)
        state = {"params": {"w": state["params"]["w"] + 1.0}}  # update: version step + 1
        out.append((rows, host))
    return out, lagged


def reads(policy, batch, step):
    return {"version": float(policy["params"]["w"]), "batch": batch["i"], "step": step}, {}


@pytest.mark.parametrize("lag", [1, 2, 3])
def test_rollout_of_step_t_reads_version_t_minus_lag(lag):
    out, _ = run(lag, 7, reads)
    assert [r["version"] for r, _ in out] == [max(t - lag, 0) for t in range(7)]
    assert [r["batch"] for r, _ in out] == list(range(7))  # each batch once, in order
    assert [h["policy_lag"] for _, h in out] == [t - max(t - lag, 0) for t in range(7)]


def test_the_rollout_runs_while_the_update_does():
    started, release = threading.Event(), threading.Event()

    def slow(policy, batch, step):
        if step == 1:
            started.set()
            release.wait(5)
        return reads(policy, batch, step)

    lagged = LaggedRollouts(slow, Data(), 1, log=lambda m: None)
    state = {"params": {"w": jnp.asarray(0.0)}}
    lagged.start(state, 0)
    lagged.rows(state, 0)
    lagged.launch(state, 0, 3)
    assert started.wait(5)  # step 1's rollout began before step 0's update ran
    release.set()
    rows, host = lagged.rows({"params": {"w": jnp.asarray(1.0)}}, 1)
    assert rows["version"] == 0.0 and host["overlap_s"] >= 0.0


def test_a_rollout_failing_on_its_thread_is_run_again_from_the_same_prompts():
    calls = []

    def flaky(policy, batch, step):
        calls.append(step)
        if step == 2 and calls.count(2) == 1:
            raise RuntimeError("worker died")
        return reads(policy, batch, step)

    out, _ = run(1, 5, flaky)
    clean, _ = run(1, 5, reads)
    assert [r for r, _ in out] == [r for r, _ in clean]
    assert calls.count(2) == 2


def test_a_hung_rollout_stops_the_run_with_an_error_naming_the_step():
    def hangs(policy, batch, step):
        if step == 2:
            time.sleep(30)
        return reads(policy, batch, step)

    t0 = time.perf_counter()
    with pytest.raises(RolloutTimeout, match="rollout of step 3 did not finish within 0.5 s"):
        run(1, 5, hangs, timeout_s=0.5)
    assert time.perf_counter() - t0 < 10


@pytest.mark.parametrize("lag", [1, 2])
def test_a_checkpoint_holds_what_resumes_the_same_rollouts(lag):
    straight, _ = run(lag, 6, reads)
    data = Data()
    first, lagged = run(lag, 6, reads, data=data, until=3)  # saved after 3 updates
    assert lagged.flight is not None and lagged.flight.step == 3  # step 3's rollout in flight
    state = {"params": {"w": jnp.asarray(3.0)}}
    lagged.quiesce(state, 3)
    tree = lagged.attach(state, 3)
    assert jnp.shape(tree[LAGGED_KEY][0]["params"]["w"]) == ()
    like = lagged.like(state)
    assert len(like[LAGGED_KEY]) == lag and set(like) == {"params", LAGGED_KEY}
    position = lagged.data_state()
    restored, versions = LaggedRollouts.detach(tree)
    assert set(restored) == {"params"}
    assert [float(v["params"]["w"]) for v in versions] == [max(3 - lag + i, 0)
                                                           for i in range(lag)]
    data = Data()
    data.set_state(position)
    rest, _ = run(lag, 6, reads, data=data, start=3, saved=versions)
    assert [r for r, _ in first + rest] == [r for r, _ in straight]


def test_a_lag_of_zero_is_refused():
    with pytest.raises(ValueError, match="at least 1"):
        LaggedRollouts(reads, Data(), 0)


def _metadata(step_dir, lag: int):
    keys = ["('params', 'w')", "('opt', 'mu', 'w')"]
    keys += [f"('{LAGGED_KEY}', '{i}', 'params', 'w')" for i in range(lag)]
    (step_dir / "state").mkdir(parents=True)
    (step_dir / "state" / "_METADATA").write_text(json.dumps(
        {"tree_metadata": {k: {} for k in keys}}))


@pytest.mark.parametrize("saved,asked", [(0, 1), (1, 0), (1, 2)])
def test_a_checkpoint_of_another_lag_is_refused_before_restoring(saved, asked, tmp_path):
    _metadata(tmp_path / "3", saved)
    assert saved_lag(tmp_path / "3") == saved
    check_saved_lag(tmp_path / "3", saved)  # the same lag: fine
    with pytest.raises(InputError, match=f"written with max_staleness = {saved} and this run "
                                         f"asks for {asked}"):
        check_saved_lag(tmp_path / "3", asked)
    assert saved_lag(tmp_path / "missing") is None


def reads_later(policy, batch, step, later):
    """A partial rollout: its first turns with `policy`, the rest with the next version."""
    return {"version": float(policy["params"]["w"]), "own": later.own, "next": later.version,
            "later": float(later.fetch()["params"]["w"]), "step": step}, {}


@pytest.mark.parametrize("lag", [1, 2])
def test_a_partial_rollout_goes_on_with_the_version_after_its_own(lag):
    out, _ = run(lag, 6, reads_later, partial=True)
    for t, (rows, _) in enumerate(out):
        own, nxt = max(t - lag, 0), max(t - lag + 1, 0)
        assert (rows["version"], rows["own"], rows["next"], rows["later"]) == (own, own, nxt, nxt)


def test_with_lag_one_the_next_version_is_the_update_running_beside_the_rollout():
    asked, got = threading.Event(), []

    def partial(policy, batch, step, later):
        if step == 1:
            asked.set()
        got.append(float(later.fetch()["params"]["w"]))
        return {}, {}

    lagged = LaggedRollouts(partial, Data(), 1, log=lambda m: None, partial=True)
    state = {"params": {"w": jnp.asarray(0.0)}}
    lagged.start(state, 0)
    lagged.rows(state, 0)
    lagged.launch(state, 0, 3)
    assert asked.wait(5)
    time.sleep(0.2)
    assert got == [0.0]  # step 0's own (clamped); step 1's waits for update 0
    lagged.rows({"params": {"w": jnp.asarray(1.0)}}, 1)  # update 0 done: version 1 handed over
    assert got == [0.0, 1.0]


def test_dropping_a_rollout_that_waits_for_a_version_does_not_hang():
    waiting = threading.Event()

    def partial(policy, batch, step, later):
        waiting.set()
        later.fetch()
        return {}, {}

    lagged = LaggedRollouts(partial, Data(), 1, log=lambda m: None, partial=True, timeout_s=5)
    state = {"params": {"w": jnp.asarray(0.0)}}
    lagged.start(state, 1, [{"params": {"w": jnp.asarray(0.0)}}])
    lagged.launch(state, 1, 4)  # step 2's rollout waits for version 2
    assert waiting.wait(5)
    t0 = time.perf_counter()
    lagged.drop()  # a rollback: the version it waits for never comes
    assert time.perf_counter() - t0 < 2 and lagged.flight is None
    lagged.quiesce(state, 1)  # nothing in flight: returns
