"""The generic training loop every recipe runs: resume, step, log, evaluate, checkpoint, stop.

Exact resume: the checkpoint holds the train state and the data iterator's position, and
metrics.jsonl is cut back to the restored step, so a run that was killed and started again
writes the same numbers as one that never stopped. SIGTERM and SIGINT save a checkpoint at the
next step boundary and stop (`Interrupted`); the same command then continues.

Guards (hone.train.guards): the step withholds non-finite updates itself; a tripped guard is
read where the loop syncs anyway (logged steps, before a save, at the end, on a signal) and
answered by a rollback to the newest checkpoint with a lower learning rate, logged as a
`guard/rollback_to` row and on the console. RL runs also check their logged `kl` against
guard.max_kl.

Also: an out-of-memory step is rebuilt with half the micro-batch and retried (hone.train.oom);
`checkpoint.grace_seconds` bounds how long a signalled run may take to stop; after a restore,
the copies of every replicated array must agree bit for bit across devices.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import jax

from hone.checkpoint import CheckpointError, Checkpointer
from hone.models.stacked import Relayout
from hone.parallel.replicas import count_replicated, replica_mismatches
from hone.train.lagged import check_saved_lag
from hone.train import guards, oom
from hone.metrics.sinks import make_sinks
from hone.parallel.profile import StepProfiler


class _PerBlock:
    """A Checkpointer for a state whose blocks are stored stacked (hone.models.stacked): it
    saves and restores the per-block layout, so a checkpoint is the same whether the run
    scanned its blocks or not, and a run may resume with train.scan_layers switched."""

    def __init__(self, ckpt: Checkpointer, relayout: Relayout):
        self.ckpt, self.relayout = ckpt, relayout

    def save(self, step: int, state: dict[str, Any], data_state: dict) -> None:
        self.ckpt.save(step, self.relayout.to_saved(state), data_state)

    def restore_latest(self, like):
        restored = self.ckpt.restore_latest(None if like is None else self.relayout.saved_like)
        if restored is None:
            return None
        return replace(restored, state=self.relayout.from_saved(restored.state))

    def __getattr__(self, name):
        return getattr(self.ckpt, name)


class Interrupted(Exception):
    """Training stopped on a signal after saving a checkpoint."""


@dataclass
class LoopSpec:
    """What a recipe hands the loop. Functions are jitted already."""

    train_step: Callable  # (state, frozen, batch, aux) -> (state, metrics)
    state: dict[str, Any]  # a fresh train state (structure for restoring, too)
    frozen: Any  # the non-trainable part of the model
    data: Any  # iterator: next() -> batch, get_state() -> dict, set_state(dict)
    aux: Any = None  # other arrays the loss reads (a frozen reference model's weights)
    eval_fn: Callable[[dict], dict] | None = None  # params -> {"eval_loss": ..., ...}
    tokens_per_batch: Callable[[dict], int] = lambda batch: 0
    flops_per_token: float = 0.0  # model FLOPs per trained token (for MFU)
    extra_metrics: Callable[[dict], dict] = field(default=lambda m: {})
    # RL: (state, data batch, step) -> (training batch, host metrics), run before each step
    # (the rollout: sampling with the current weights, rewards); None for fixed data.
    prepare: Callable[[dict, dict, int], tuple[dict, dict]] | None = None
    # Puts a training batch on the mesh (rows over data x fsdp); identity on one device.
    place_batch: Callable[[dict], dict] = field(default=lambda batch: batch)
    # Evaluate the starting weights too (a step-0 row), when a run starts fresh.
    eval_at_start: bool = False
    # RL with a fixed policy lag (hone.train.lagged): the rollouts through `prepare` run that
    # many versions behind the updates, overlapped with them; None = synchronous.
    lag: Any = None


class _SignalFlag:
    """Turn SIGTERM/SIGINT into a flag checked between steps (saved, then stopped).

    With a grace period, a process that has not stopped `grace` seconds after the signal exits
    at once (status 1), as does one that gets a second signal: the checkpoints on disk are
    complete or invisible (atomic commits), so nothing but the unsaved steps is lost."""

    def __init__(self, grace: float | None = None, exit=os._exit):
        self.raised: int | None = None
        self.previous = {}
        self.grace, self.exit = grace, exit
        self.timer: threading.Timer | None = None

    def __enter__(self):
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                self.previous[sig] = signal.signal(sig, self._handle)
            except ValueError:  # not the main thread: leave signals alone
                pass
        return self

    def _handle(self, signum, frame):
        if self.raised is not None:
            self._expire(f"a second signal ({signum})")
            return
        self.raised = signum
        if self.grace is not None:
            self.timer = threading.Timer(self.grace, self._expire,
                                         (f"the grace period of {self.grace:g} s",))
            self.timer.daemon = True
            self.timer.start()

    def _expire(self, why: str) -> None:
        print(f"stopping at once after {why}: the step in progress and any unsaved steps "
              f"are lost; the newest complete checkpoint is kept, run the same command to "
              f"resume", file=sys.stderr, flush=True)
        self.exit(1)

    def __exit__(self, *exc):
        if self.timer is not None:
            self.timer.cancel()
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _host(metrics: dict) -> dict:
    return {k: v.item() if hasattr(v, "item") else v for k, v in jax.device_get(metrics).items()}


def run_loop(spec: LoopSpec, cfg, run_dir: Path) -> dict[str, Any]:
    """Train to cfg.train.max_steps from the newest checkpoint in run_dir (or from scratch).

    Returns the final train state, its parameters keyed per block as a checkpoint keeps them
    (also when the run stored them stacked, hone.models.stacked). `cfg` is a TrainConfig
    (train, checkpoint, log sections).
    """
    train, ckpt_cfg, log = cfg.train, cfg.checkpoint, cfg.log
    ckpt = Checkpointer(run_dir / "checkpoints", keep=ckpt_cfg.keep,
                        async_save=ckpt_cfg.async_save, exclusive=True)  # refused if in use
    lag = spec.lag
    # What a checkpoint holds: the train state, and with a policy lag the versions the next
    # rollouts read (hone.train.lagged).
    saved_like = spec.state if lag is None else lag.like(spec.state)
    relayout = Relayout.of(saved_like)
    if relayout is not None:  # blocks stored stacked: checkpoints keep them per block
        ckpt = _PerBlock(ckpt, relayout)
    state, start, versions = spec.state, 0, None
    # Shapes, dtypes and shardings to restore into; spec.state itself is donated to the step.
    like = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                        saved_like)
    # The newest checkpoint whose manifest verifies (older ones if it is damaged).
    try:
        newest = ckpt.latest_step()
        if newest is not None:  # written with this run's policy lag (hone.train.lagged)?
            check_saved_lag(ckpt.directory / str(newest), 0 if lag is None else lag.lag)
        restored = ckpt.restore_latest(saved_like)
    except BaseException:  # none usable: release the folder's lock before stopping
        ckpt.close()
        raise
    latest = restored.step if restored is not None else None
    if restored is not None:
        state = restored.state
        if lag is not None:
            state, versions = lag.detach(state)
        spec.data.set_state(restored.data_state)
        start = latest
        _check_replicas(state, ckpt, latest)
        if jax.process_index() == 0:
            copies = count_replicated(state)
            agree = f", {copies} replicated arrays agree on every device" if copies else ""
            print(f"resumed from step {latest} of {ckpt.directory} "
                  f"(checkpoint sha256 {restored.checkpoint_hash}{agree})", file=sys.stderr)
    state = guards.configure(state, cfg.guard)  # the limits in force are the config's
    if lag is not None:
        lag.start(state, start, versions)
    sinks = []
    if jax.process_index() == 0:  # one process writes the logs; every process checkpoints
        try:
            sinks = make_sinks(log.sinks, run_dir, max_steps=train.max_steps,
                               resume_step=latest if latest is not None else None,
                               prometheus_port=log.prometheus_port,
                               prometheus_host=log.prometheus_host,
                               wandb_project=log.wandb_project)
        except BaseException:  # a sink that cannot start: release the folder's lock
            ckpt.close()
            raise
    last_saved = start if latest is not None else None
    if spec.eval_at_start and spec.eval_fn is not None and latest is None:
        for sink in sinks:
            sink.write(0, spec.eval_fn(state["params"]))
    window_tokens, window_t0 = 0, time.perf_counter()
    profiler = StepProfiler(log.profile_steps, run_dir, train.max_steps)
    try:
        with _SignalFlag(ckpt_cfg.grace_seconds) as flag:
            step = start
            while step < train.max_steps:
                profiler.before(step + 1, state)
                t_step = time.perf_counter()
                host: dict[str, Any] = {}
                if lag is not None:  # this step's rows, then the next rollout starts
                    batch, host = lag.rows(state, step)
                    lag.launch(state, step, train.max_steps)
                else:
                    batch = spec.data.next()
                    if spec.prepare is not None:
                        batch, host = spec.prepare(state, batch, step)
                t_update = time.perf_counter()
                out = _train_step(spec, state, spec.place_batch(batch), step + 1, sinks)
                if out is None:  # out of memory after the donated state was consumed
                    state, step = _restore_after_oom(ckpt, like, spec, cfg, step + 1)
                    last_saved = step
                    continue
                state, metrics = out
                if spec.prepare is not None:
                    jax.block_until_ready(state)
                    host["update_s"] = time.perf_counter() - t_update
                    host["step_s"] = time.perf_counter() - t_step
                step += 1
                window_tokens += spec.tokens_per_batch(batch)
                row: dict[str, Any] = profiler.after(step, state)  # {} unless a trace ended
                window_t0 += row.get("profile/trace_s", 0.0)  # not training time
                if step % log.every_steps == 0 or step == train.max_steps:
                    row.update(_host(metrics))
                    row.update(host)
                    seconds = time.perf_counter() - window_t0
                    row["tokens_per_s"] = window_tokens / max(seconds, 1e-9)
                    if log.peak_flops:
                        row["mfu"] = row["tokens_per_s"] * spec.flops_per_token / log.peak_flops
                    window_tokens, window_t0 = 0, time.perf_counter()
                evaluate = spec.eval_fn is not None and (
                    (train.eval_every and step % train.eval_every == 0)
                    or step == train.max_steps)
                if evaluate:
                    if lag is not None:  # greedy evaluation does not overlap a rollout
                        lag.quiesce(state, step)
                    row.update(spec.eval_fn(state["params"]))
                    window_t0 = time.perf_counter()  # evaluation time is not training time
                if row:
                    row.update(spec.extra_metrics(row))
                    for sink in sinks:
                        sink.write(step, row)
                save_due = bool(ckpt_cfg.every_steps and step % ckpt_cfg.every_steps == 0)
                reason = 0
                if "loss" in row or save_due or step == train.max_steps or flag.raised:
                    reason = guards.tripped(state)
                if not reason and guards.kl_overshoot(cfg.guard, row):
                    reason = guards.KL_TRIP  # the logged `kl` (RL rows), already on the host
                if reason:
                    state, step = _roll_back(state, reason, step, ckpt, like, spec, cfg, sinks)
                    last_saved = step
                    continue
                if save_due:
                    _save(ckpt, step, state, spec)
                    last_saved = step
                if flag.raised is not None and step < train.max_steps:
                    if last_saved != step:
                        _save(ckpt, step, state, spec)
                    ckpt.wait()
                    if lag is not None:
                        lag.drop()
                    raise Interrupted(f"stopped by signal {flag.raised} after step {step}; "
                                      f"checkpoint saved, run the same command to resume")
            if last_saved != step:
                _save(ckpt, step, state, spec)
    finally:
        profiler.close()
        ckpt.close()
        for sink in sinks:
            sink.close()
    return state if relayout is None else relayout.to_saved(state)


def _save(ckpt, step: int, state, spec: LoopSpec) -> None:
    """A checkpoint of `step`: the state and data position, with a policy lag also the
    versions the next rollouts read and the position before the rollout in flight."""
    if spec.lag is None:
        ckpt.save(step, state, spec.data.get_state())
    else:
        ckpt.save(step, spec.lag.attach(state, step), spec.lag.data_state())


def _restore(ckpt, like, spec: LoopSpec):
    """The newest checkpoint (None when there is none), its data position set and, with a
    policy lag, the rollout in flight dropped and the lag restarted from its versions."""
    if spec.lag is not None:
        spec.lag.drop()  # before the data position moves: a rollout may be reading it
    restored = ckpt.restore_latest(like)
    if restored is None:
        return None
    spec.data.set_state(restored.data_state)
    if spec.lag is not None:
        state, versions = spec.lag.detach(restored.state)
        spec.lag.start(state, restored.step, versions)
        restored = replace(restored, state=state)
    return restored


def _roll_back(state, reason: int, step: int, ckpt: Checkpointer, like, spec: LoopSpec, cfg,
               sinks) -> tuple[dict[str, Any], int]:
    """(state, step) to continue from after a guard tripped at `step`: the newest checkpoint
    with the guard's counters carried over and a lower learning-rate scale (GuardError when
    that is not possible)."""
    ckpt.wait()
    restored = _restore(ckpt, like, spec)
    new = guards.rollback(state, restored.state if restored else None, cfg.guard, reason, step,
                          restored.step if restored else None)
    row = dict(_host(guards.metrics(new["guard"])), **{"guard/rollback_to": restored.step,
                                                        "guard/tripped": reason})
    if jax.process_index() == 0:
        print(f"guard: {guards.REASONS[reason]} at step {step}; rolled back to step "
              f"{restored.step}, learning-rate scale now {row['guard/lr_scale']:.4g} "
              f"(rollback {row['guard/rollbacks']} of {cfg.guard.max_rollbacks})",
              file=sys.stderr)
    for sink in sinks:
        sink.write(step, row)
    return new, restored.step


def _train_step(spec: LoopSpec, state, batch, step: int, sinks):
    """spec.train_step on `batch`; on an out-of-memory error the step is rebuilt with half the
    micro-batch (hone.train.oom) and the batch tried again. None when the failed call had
    consumed the donated state: the caller then restores the newest checkpoint."""
    while True:
        try:
            return spec.train_step(state, spec.frozen, batch, spec.aux)
        except Exception as e:  # noqa: BLE001 - anything but an out-of-memory error re-raises
            if not (oom.is_out_of_memory(e) and isinstance(spec.train_step, oom.AccumStep)):
                raise
            spec.train_step = smaller = spec.train_step.doubled(e)
        if jax.process_index() == 0:
            print(f"out of memory at step {step}: continuing with {smaller.micro} examples per "
                  f"device per micro-batch and train.grad_accum = {smaller.accum} (the same "
                  f"global batch; set train.grad_accum = {smaller.accum} to start there)",
                  file=sys.stderr)
        for sink in sinks:
            sink.write(step, {"oom/grad_accum": smaller.accum, "oom/micro_batch": smaller.micro})
        if not oom.state_intact(state):
            return None


def _restore_after_oom(ckpt: Checkpointer, like, spec: LoopSpec, cfg, step: int):
    """(state, step) of the newest checkpoint, its data position restored."""
    ckpt.wait()
    restored = _restore(ckpt, like, spec)
    if restored is None:
        raise oom.OutOfMemory(
            f"the train step ran out of device memory at step {step}, before the first "
            f"checkpoint, and the failed call had consumed the train state; run the same "
            f"command with train.grad_accum = {spec.train_step.accum} to start at the "
            f"smaller micro-batch", key="train.grad_accum")
    if jax.process_index() == 0:
        print(f"out of memory: the train state was lost with the failed step; continuing "
              f"from the checkpoint of step {restored.step}", file=sys.stderr)
    return guards.configure(restored.state, cfg.guard), restored.step


def _check_replicas(state, ckpt: Checkpointer, step: int) -> None:
    """Every copy of a replicated array of the restored state is bit-identical (else stop)."""
    bad = replica_mismatches(state)
    if bad:
        ckpt.close()
        raise CheckpointError(
            f"after restoring step {step}, the copies of {len(bad)} replicated arrays differ "
            f"between devices ({', '.join(bad[:5])}); the devices would train different "
            f"weights. Check the hardware and the checkpoint files, then resume again",
            path=str(ckpt.directory))
