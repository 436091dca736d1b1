"""Rollouts a fixed number of policy versions behind the update, overlapped with it: the
training loop's side of asynchronous RL (`grpo.max_staleness`, `ppo.max_staleness`).

Version v of the policy is the trainable state after v updates. With lag k, the rollout of step
t (0-based: the one update t trains on) is sampled with version max(t - k, 0), exactly, so it can
run while update t - 1 does: `launch` starts it on a background thread as soon as step t - 1's
rows are in hand, and `rows` waits for it at step t. Because the lag is fixed and every rollout
draws its samples from keys of the seed and step alone, the run's numbers do not depend on which
side finishes first: two runs of one config agree bit for bit, and so does a resumed one.

What a resume needs is in the checkpoint (`attach` / `detach`): the k versions the next k
rollouts read (versions s - k .. s - 1 after step s, the oldest repeated while s < k) and the
data iterator's position before the next rollout drew its prompts. A rollout in flight when the
run stops is not saved; it is sampled again, identically, from those versions.

Partial episodes (`partial=True`, agent.switch_turn): the rollout of step t may go on with the
next version, max(t - k + 1, 0), from some turn of its episodes on. `prepare` is then called
with `later=NextVersion(...)`, whose `fetch()` waits until that version exists: with k = 1 it
is the state update t - 1 produces, handed over when the loop next calls `rows` (or
`quiesce`), so the rollout's first turns overlap the update and its later turns follow it.
Which turns use which version is fixed by the config, so the numbers still do not depend on
timing.

Faults: a rollout that raises on the background thread is run once more on the loop's thread
from the same data position (the same numbers; logged); a second failure stops the run. A
rollout that does not finish within `timeout_s` stops the run with `RolloutTimeout`, naming
the step; the checkpoints already written stay as they are.
"""

from __future__ import annotations

import ast
import json
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import jax
import jax.numpy as jnp

from hone.errors import InputError

LAGGED_KEY = "lagged_policy"  # the checkpoint's entry of the versions the next rollouts read


class RolloutTimeout(InputError):
    """A rollout did not finish in time (a hung reward, environment or sampler)."""


class Cancelled(RuntimeError):
    """The rollout in flight was dropped while it waited for a policy version."""


@dataclass
class NextVersion:
    """What a rollout may continue its episodes with: the version after its own (`own`),
    `version`, whose {key: state[key]} `fetch()` returns once the update that makes it has
    run (the same as `own` while the lag is clamped at version 0)."""

    own: int
    version: int
    fetch: Callable[[], dict]


class _Flight:
    """One rollout on a background thread: its step, the data position before it drew its
    prompts, and its result or error once done."""

    def __init__(self, step: int, data_state: dict, fn: Callable[[], Any]):
        self.step, self.data_state = step, data_state
        self.result, self.error, self.seconds = None, None, 0.0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True,
                                       name=f"hone-rollout-{step}")
        self.started = time.perf_counter()
        self.thread.start()

    def _run(self, fn) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the loop's thread
            self.error = e
        finally:
            self.seconds = time.perf_counter() - self.started
            self.done.set()


class LaggedRollouts:
    """The rollouts of an RL run, `lag` policy versions behind its updates.

    prepare(policy_state, data_batch, step) -> (rows, host metrics): the recipe's rollout
    (hone.train.loop.LoopSpec.prepare), given {key: state[key] for key in keys} of the version
    it is to sample with. data: the loop's iterator (next, get_state, set_state)."""

    def __init__(self, prepare: Callable, data, lag: int, *, keys: tuple[str, ...] = ("params",),
                 timeout_s: float | None = None, log=None, partial: bool = False):
        if lag < 1:
            raise ValueError(f"LaggedRollouts needs a lag of at least 1, got {lag}")
        self.prepare, self.data, self.lag, self.keys = prepare, data, lag, keys
        self.timeout_s = timeout_s
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self.versions: dict[int, dict] = {}  # version -> {key: copy of state[key]}
        self.partial = partial  # prepare(..., later=NextVersion) (module doc: partial episodes)
        self.published = threading.Condition()  # guards versions; notified on a new one
        self.cancelled = False  # the rollout in flight is being dropped
        self.flight: _Flight | None = None
        self.next_data_state: dict | None = None  # before the next rollout drew its prompts

    # -- the loop's calls, in order: start, then per step rows -> launch -> (save) ------------

    def start(self, state: dict, step: int, saved: list[dict] | None = None) -> None:
        """Begin at `step` with `state` (version `step`): fresh (saved None, step 0) or resumed
        from a checkpoint's `detach`ed versions (s - k .. s - 1, clamped at 0)."""
        self.drop()
        with self.published:
            self.versions = {}
            if saved is not None:
                for i, tree in enumerate(saved):
                    self.versions[max(step - self.lag + i, 0)] = tree
        self.publish(state, step)
        self.next_data_state = None

    def publish(self, state: dict, version: int) -> None:
        """Keep `state` as `version` (a copy: the update consumes the state) for the rollouts
        that read it, and wake one waiting for it."""
        with self.published:
            if version not in self.versions:
                self.versions[version] = self._copy(state)
                self.published.notify_all()

    def rows(self, state: dict, step: int) -> tuple[dict, dict]:
        """The training rows of `step` and their host metrics: the rollout in flight for it
        (waited for), else sampled now with version max(step - lag, 0)."""
        version = max(step - self.lag, 0)
        self.publish(state, step)  # the version a partial rollout in flight may wait for
        flight, self.flight = self.flight, None
        wait_s = 0.0
        if flight is not None and flight.step == step:
            t0 = time.perf_counter()
            self._join(flight)
            wait_s = time.perf_counter() - t0
            if flight.error is None:
                batch, host = flight.result
                return batch, self._metrics(host, step, version, flight.seconds, wait_s)
            self.log(f"the rollout of step {step + 1} failed on its thread "
                     f"({type(flight.error).__name__}: {flight.error}); running it again from "
                     f"the same prompts")
            self.data.set_state(flight.data_state)
        elif flight is not None:  # a rollout for another step (after a rollback): not used
            self._join(flight)
        t0 = time.perf_counter()
        batch, host = self._prepare(version, self.data.next(), step)
        seconds = time.perf_counter() - t0
        return batch, self._metrics(host, step, version, seconds, seconds)

    def launch(self, state: dict, step: int, max_steps: int) -> None:
        """Before update `step` runs on `state` (version `step`): keep a copy of this version
        (the update consumes the state) and start the rollout of step + 1 with version
        step + 1 - lag."""
        self.publish(state, step)
        with self.published:
            for v in [v for v in self.versions if v < step + 1 - self.lag]:
                del self.versions[v]
            self.cancelled = False
        self.next_data_state = None
        if step + 1 >= max_steps:
            return
        self.next_data_state = self.data.get_state()
        batch = self.data.next()
        version = max(step + 1 - self.lag, 0)
        self.flight = _Flight(step + 1, self.next_data_state,
                              lambda: self._prepare(version, batch, step + 1))

    def attach(self, state: dict, step: int) -> dict:
        """The tree a checkpoint after `step` updates saves: the state and the k versions the
        next rollouts read (s - k .. s - 1, clamped at 0)."""
        saved = [self.versions[max(step - self.lag + i, 0)] for i in range(self.lag)]
        return dict(state, **{LAGGED_KEY: saved})

    def like(self, state: dict) -> dict:
        """`attach`'s structure for a state like `state` (for restoring)."""
        part = {k: state[k] for k in self.keys}
        return dict(state, **{LAGGED_KEY: [part] * self.lag})

    @staticmethod
    def detach(saved: dict) -> tuple[dict, list[dict]]:
        """(state, versions) of a restored checkpoint tree."""
        saved = dict(saved)
        return saved, saved.pop(LAGGED_KEY)

    def data_state(self) -> dict:
        """The data position a checkpoint saves: before the rollout in flight drew its
        prompts (it is sampled again on resume)."""
        if self.next_data_state is not None:
            return self.next_data_state
        return self.data.get_state()

    def quiesce(self, state: dict, step: int) -> None:
        """Let the rollout in flight finish (its result is kept), given `state` (version
        `step`, which it may wait for): before work that must not overlap it, like a greedy
        evaluation."""
        self.publish(state, step)
        if self.flight is not None:
            self._join(self.flight)

    def drop(self) -> None:
        """Finish and forget the rollout in flight (a rollback or restore follows); one
        waiting for a version that will not come stops (`Cancelled`)."""
        if self.flight is not None:
            with self.published:
                self.cancelled = True
                self.published.notify_all()
            self._join(self.flight)
            self.flight = None

    # -- internals ----------------------------------------------------------------------------

    def _prepare(self, version: int, batch, step: int):
        """The recipe's rollout of `step` with `version` (and, for partial episodes, the next
        version to continue with)."""
        with self.published:
            policy = self.versions[version]
        if not self.partial:
            return self.prepare(policy, batch, step)
        later = max(step - self.lag + 1, 0)
        return self.prepare(policy, batch, step,
                            later=NextVersion(version, later, lambda: self._wait_for(later)))

    def _wait_for(self, version: int) -> dict:
        with self.published:
            while version not in self.versions:
                if self.cancelled:
                    raise Cancelled(f"policy version {version} will not come: the rollout "
                                    f"waiting for it was dropped")
                self.published.wait()
            return self.versions[version]

    def _copy(self, state: dict) -> dict:
        # Fresh buffers: the update donates (and so invalidates) the state's own.
        return {k: jax.tree.map(jnp.copy, state[k]) for k in self.keys}

    def _join(self, flight: _Flight) -> None:
        if not flight.done.wait(self.timeout_s):
            raise RolloutTimeout(
                f"the rollout of step {flight.step + 1} did not finish within "
                f"{self.timeout_s:g} s (a reward function, environment or the sampler hangs); "
                f"checkpoints written so far are intact: fix the cause and run the same "
                f"command to resume", key="rollout_timeout_s")

    @staticmethod
    def _metrics(host: dict, step: int, version: int, seconds: float, wait_s: float) -> dict:
        host = dict(host)
        # Partial episodes say which versions sampled their tokens (mean over them).
        host["policy_lag"] = float(step - host.pop("sampled_version_mean", version))
        host["rollout_s"] = float(seconds)  # the rollout's own wall time, start to finish
        host["rollout_wait_s"] = float(wait_s)  # what the step waited for it
        host["overlap_s"] = max(float(seconds) - float(wait_s), 0.0)
        return host


def saved_lag(step_dir: Path) -> int | None:
    """The lag a checkpoint step was written with (how many versions it holds under
    LAGGED_KEY; 0 for a synchronous run), read from Orbax's tree metadata; None when that
    cannot be read (the restore then decides)."""
    try:
        tree = json.loads((Path(step_dir) / "state" / "_METADATA").read_text())["tree_metadata"]
        keys = [ast.literal_eval(k) for k in tree]
    except (OSError, ValueError, KeyError, SyntaxError, TypeError):
        return None
    return len({k[1] for k in keys if isinstance(k, tuple) and len(k) > 1
                and k[0] == LAGGED_KEY})


def check_saved_lag(step_dir: Path, lag: int) -> None:
    """Refuse to resume a checkpoint written with another max_staleness (its saved tree
    differs), before anything is restored or written."""
    saved = saved_lag(step_dir)
    if saved is not None and saved != lag:
        raise InputError(
            f"the newest checkpoint ({step_dir}) was written with max_staleness = {saved} and "
            f"this run asks for {lag}: a checkpoint holds that many policy versions, so the two "
            f"cannot resume each other. Keep max_staleness = {saved} for this run_dir, or start "
            f"a new run_dir", key="max_staleness")


def lagged(section, prepare: Callable, data, *, keys: tuple[str, ...] = ("params",), log=None,
           partial: bool = False):
    """The run's `LoopSpec.lag`: LaggedRollouts when the RL section asks for a policy lag
    (`max_staleness` > 0), else None (the rollout waits for the update). partial: episodes go
    on with the next version (agent.switch_turn)."""
    if not section.max_staleness:
        return None
    return LaggedRollouts(prepare, data, section.max_staleness, keys=keys,
                          timeout_s=section.rollout_timeout_s, log=log, partial=partial)
