"""Tracing chosen training steps with `jax.profiler` and measuring their communication share.

`log.profile_steps=[3,4]` traces steps 3 to 4 into run_dir/profile (a TensorBoard/xprof log
folder; with several processes, run_dir/profile/process-N), then reads the trace back and logs
`profile/collective_fraction`: the share of device op time spent in collectives. Design choices:

- One contiguous trace from the first to the last chosen step (gaps included): one session is
  one file to open, and starting a session costs more than the steps between. The state is made
  ready before the trace starts and before it stops, so the traced device work is exactly that
  of the traced steps, not the tail of an earlier asynchronously dispatched one (an evaluation
  due strictly inside the range is traced too). A range past train.max_steps ends there.
- The parsed format is the Chrome/Perfetto JSON (`<host>.trace.json.gz`) that jax writes beside
  the `.xplane.pb`: the standard library reads it. `create_perfetto_trace` also leaves a
  `perfetto_trace.json.gz` that ui.perfetto.dev opens with nothing installed.
- Device ops: on XLA:CPU (what hone's tests run) every executed HLO op is a complete event on a
  host thread carrying an `hlo_op` argument (`all-reduce.2`, `dot.1`, `ynn_fusion`); the threads
  of the different host devices are different, and nested events (the ops inside a `while`, e.g.
  gradient accumulation's scan) would count twice, so each op counts its self time: its duration
  less that of the ops nested in it on its thread. On accelerators the ops are read instead from
  the "XLA Ops" lines of the `/device:*` processes, xprof's own per-op timeline (this branch is
  checked against a hand-written trace only: no accelerator was at hand).
- Collectives are recognised by HLO op name (all-reduce, all-gather, reduce-scatter, all-to-all,
  collective-permute/-broadcast, send/recv, their -start/-done halves) and NCCL kernel names.
  An op's time includes waiting for the slowest participant, so load imbalance shows up as
  collective time, as it does in xprof.
- The fraction is of op time summed over devices (8 devices x 1 ms of ops = 8 ms), so each
  device weighs by how long it was busy; idle gaps between ops count in neither part.
"""

from __future__ import annotations

import gzip
import json
import re
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import jax

COLLECTIVE = re.compile(
    r"all-?reduce|all-?gather|reduce-?scatter|all-?to-?all|collective-?permute"
    r"|collective-?broadcast|\b(send|recv)(-done|-start)?\b|nccl|psum", re.IGNORECASE)


def read_trace(session: Path) -> list[dict]:
    """The events of every `*.trace.json.gz` (one per host) in a profiler session folder."""
    events = []
    for path in sorted(Path(session).glob("*.trace.json.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            events.extend(json.load(f).get("traceEvents", []))
    return events


def device_ops(events: list[dict]) -> list[dict]:
    """The complete ("X") events that are executed device ops (see the module docstring)."""
    names = {}  # (pid, tid or None) -> process or thread name
    for e in events:
        if e.get("ph") == "M" and e.get("name") in ("process_name", "thread_name"):
            names[(e.get("pid"), e.get("tid") if e["name"] == "thread_name" else None)] = \
                e.get("args", {}).get("name", "")
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e]
    devices = {pid for (pid, tid), name in names.items()
               if tid is None and name.startswith("/device:")}
    if devices:
        return [e for e in complete if e.get("pid") in devices
                and names.get((e.get("pid"), e.get("tid"))) == "XLA Ops"]
    return [e for e in complete if "hlo_op" in e.get("args", {})]


def self_times(ops: list[dict]) -> list[float]:
    """Each op's duration less the time of ops nested in it on the same thread (microseconds)."""
    own = [float(e["dur"]) for e in ops]
    threads = defaultdict(list)
    for i, e in enumerate(ops):
        threads[(e.get("pid"), e.get("tid"))].append(i)
    for members in threads.values():
        members.sort(key=lambda i: (float(ops[i]["ts"]), -own[i]))  # parents before children
        open_ops: list[tuple[float, int]] = []  # (end, index) of the enclosing ops, innermost last
        for i in members:
            start = float(ops[i]["ts"])
            end = start + float(ops[i]["dur"])
            while open_ops and open_ops[-1][0] <= start:
                open_ops.pop()
            if open_ops:  # nested: the parent's self time loses this op's share of it
                parent_end, parent = open_ops[-1]
                own[parent] -= min(end, parent_end) - start
            open_ops.append((end, i))
    return own


def collective_share(events: list[dict]) -> dict[str, float]:
    """{"op_ms", "collective_ms", "collective_fraction"} over the device ops of a trace."""
    ops = device_ops(events)
    total = collective = 0.0
    for e, us in zip(ops, self_times(ops)):
        total += us
        label = f"{e.get('name', '')} {e.get('args', {}).get('hlo_op', '')}"
        if COLLECTIVE.search(label):
            collective += us
    return {"op_ms": total / 1e3, "collective_ms": collective / 1e3,
            "collective_fraction": collective / total if total > 0 else 0.0}


class StepProfiler:
    """Traces steps min(steps)..max(steps) of a run; does nothing when `steps` is empty.

    The loop calls `before(step, state)` before each step (numbered from 1), `after(step, state)`
    after it, which returns the metrics once the trace ends (`profile/trace_s`, the seconds spent
    writing and reading the trace, lets the loop keep them out of tokens/s), and `close()` when
    it stops early.
    """

    def __init__(self, steps: tuple[int, ...], run_dir: Path, max_steps: int):
        self.first = min(steps) if steps else None
        self.last = min(max(steps), max_steps) if steps else None
        self.folder = Path(run_dir) / "profile"
        if jax.process_count() > 1:
            self.folder = self.folder / f"process-{jax.process_index()}"
        self.started: int | None = None  # the first traced step, while tracing
        self.done = False
        self._sessions: set[Path] = set()

    def before(self, step: int, state: Any) -> None:
        if self.done or self.started is not None or self.first is None:
            return
        if self.first <= step <= self.last:  # a resumed run traces what is left of the range
            jax.block_until_ready(state)  # earlier steps' device work stays out of the trace
            self._sessions = set(self.folder.glob("plugins/profile/*"))
            jax.profiler.start_trace(self.folder, create_perfetto_trace=True)
            self.started = step

    def after(self, step: int, state: Any) -> dict[str, float]:
        if self.started is None or step < self.last:
            return {}
        jax.block_until_ready(state)
        t0 = time.perf_counter()
        jax.profiler.stop_trace()
        first, self.started, self.done = self.started, None, True
        if jax.process_index() != 0:  # process 0 alone writes metrics
            return {}
        new = set(self.folder.glob("plugins/profile/*")) - self._sessions
        session = max(new, key=lambda p: p.stat().st_mtime)
        share = collective_share(read_trace(session))
        print(f"profile: steps {first}-{step} traced to {session} (open perfetto_trace.json.gz "
              f"in ui.perfetto.dev); collectives {share['collective_fraction']:.1%} of "
              f"{share['op_ms']:.1f} ms of device ops", flush=True)
        return {f"profile/{k}": v for k, v in share.items()} | {
            "profile/steps": step - first + 1,
            "profile/trace_s": time.perf_counter() - t0}  # writing and reading the trace

    def close(self) -> None:
        """Stop a trace still running (the loop ended early); the trace is kept, not parsed."""
        if self.started is not None:
            jax.profiler.stop_trace()
            self.started = None
