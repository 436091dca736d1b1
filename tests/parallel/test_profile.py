"""log.profile_steps: the collective share read from hand-written traces (exact fractions), and a
tiny SFT run through the CLI on 8 host devices (collectives > 0) and on one device (exactly 0).

The runs are subprocesses, since the host device count is fixed when JAX starts.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from hone.config import SFTConfig, load_config
from hone.errors import InputError
from hone.parallel.profile import collective_share, read_trace

from hostenv import host_devices_env

ROOT = Path(__file__).resolve().parents[2]


def _op(tid, name, ts, dur, pid=1, **args):
    return {"ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur, "name": name,
            "args": args}


def _write_session(folder: Path, events: list[dict]) -> Path:
    folder.mkdir(parents=True)
    with gzip.open(folder / "host.trace.json.gz", "wt", encoding="utf-8") as f:
        json.dump({"displayTimeUnit": "ns", "metadata": {}, "traceEvents": events}, f)
    return folder


def test_cpu_trace_counts_self_time_of_hlo_ops_on_every_device_thread(tmp_path):
    # XLA:CPU layout: one host process, each device's ops on its own thread, each op an "X"
    # event with an hlo_op argument. Durations in microseconds.
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 1, "tid": 10, "name": "thread_name", "args": {"name": "tf_XLAEigen/1"}},
        # Python and runtime events: no hlo_op, not device ops.
        _op(99, "PjitFunction(step)", 0, 500),
        _op(10, "Rendezvous", 12, 20),
        _op(10, "end: all-reduce.2", 40, 1),
        {"ph": "i", "pid": 1, "tid": 10, "ts": 5, "name": "marker"},
        # Device 0 (thread 10): 10 + 30 (collective) + while self 40 - 15 - 10 = 15
        # + 15 (collective) + 10 = 80 us, of which 45 in collectives.
        _op(10, "fusion.1", 0, 10, hlo_op="fusion.1"),
        _op(10, "all-reduce.2", 10, 30, hlo_op="all-reduce.2"),
        _op(10, "while.3", 50, 40, hlo_op="while.3"),
        _op(10, "all-gather.4", 55, 15, hlo_op="all-gather.4"),
        _op(10, "dot.5", 75, 10, hlo_op="dot.5"),
        # Device 1 (thread 11, overlapping device 0 in time): 20 (collective) + 5 + 5
        # (collective) + 10 (a fusion with "reduce" in its name: not a collective) + 10
        # (collective) = 50 us, of which 35 in collectives.
        _op(11, "reduce-scatter.1", 0, 20, hlo_op="reduce-scatter.1"),
        _op(11, "copy.2", 20, 5, hlo_op="copy.2"),
        _op(11, "collective-permute-start.3", 30, 5, hlo_op="collective-permute-start.3"),
        _op(11, "add_reduce_fusion", 40, 10, hlo_op="add_reduce_fusion"),
        _op(11, "all-to-all.7", 50, 10, hlo_op="all-to-all.7"),
    ]
    share = collective_share(read_trace(_write_session(tmp_path / "session", events)))
    assert share["collective_fraction"] == pytest.approx(80 / 130, rel=1e-12)
    assert share["op_ms"] == pytest.approx(0.130, rel=1e-12)
    assert share["collective_ms"] == pytest.approx(0.080, rel=1e-12)


def test_accelerator_trace_reads_only_the_xla_ops_lines_of_device_processes(tmp_path):
    events = [
        {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "/host:CPU"}},
        {"ph": "M", "pid": 2, "name": "process_name", "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "pid": 2, "tid": 1, "name": "thread_name", "args": {"name": "XLA Ops"}},
        {"ph": "M", "pid": 2, "tid": 2, "name": "thread_name", "args": {"name": "Stream #13"}},
        # Host launches and stream kernels repeat the ops: both are skipped.
        _op(7, "all-reduce-start.1", 0, 50, pid=1, hlo_op="all-reduce-start.1"),
        _op(2, "ncclDevKernel_AllReduce_Sum_f32", 0, 30, pid=2, hlo_op="all-reduce-start.1"),
        # The op line: 30 us of all-reduce, 10 of fusion.
        _op(1, "all-reduce-start.1", 0, 30, pid=2),
        _op(1, "fusion.2", 30, 10, pid=2),
    ]
    share = collective_share(read_trace(_write_session(tmp_path / "session", events)))
    assert share["collective_fraction"] == pytest.approx(0.75, rel=1e-12)


def test_a_trace_without_device_ops_gives_fraction_zero(tmp_path):
    share = collective_share(read_trace(_write_session(tmp_path / "s", [_op(1, "python", 0, 9)])))
    assert share == {"op_ms": 0.0, "collective_ms": 0.0, "collective_fraction": 0.0}


def test_profile_steps_config():
    assert load_config(SFTConfig, None, ["log.profile_steps=[2,3]"]).log.profile_steps == (2, 3)
    assert SFTConfig().log.profile_steps == ()
    with pytest.raises(InputError, match="must be >= 1, got 0"):
        load_config(SFTConfig, None, ["log.profile_steps=[0,3]"])


def _sft(run_dir: Path, devices: int, *overrides: str) -> str:
    env = host_devices_env(devices)
    out = subprocess.run(
        [sys.executable, "-m", "hone.cli", "sft", "--config", "configs/tiny/sft.yaml",
         f"run_dir={run_dir}", "train.max_steps=4", "train.eval_every=0", "data.eval_path=null",
         "log.sinks=[jsonl]", "checkpoint.every_steps=0", "log.profile_steps=[2,3]",
         *overrides], env=env, cwd=ROOT, timeout=300, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _profile_row(run_dir: Path) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    traced = [r for r in rows if "profile/collective_fraction" in r]
    assert [r["step"] for r in traced] == [3]  # the row of the last traced step, once
    return traced[0]


def test_sft_on_8_host_devices_logs_a_collective_share(tmp_path):
    stdout = _sft(tmp_path / "run", 8, "mesh.data=1", "mesh.fsdp=8")
    row = _profile_row(tmp_path / "run")
    print(f"\ncollective share on 8 host devices (fsdp=8): {row['profile/collective_fraction']:.3f}"
          f" of {row['profile/op_ms']:.0f} ms")
    assert 0 < row["profile/collective_fraction"] < 1
    assert row["profile/steps"] == 2 and row["profile/op_ms"] > row["profile/collective_ms"] > 0
    sessions = list((tmp_path / "run/profile/plugins/profile").iterdir())
    assert len(sessions) == 1 and list(sessions[0].glob("*.trace.json.gz"))
    assert (sessions[0] / "perfetto_trace.json.gz").exists()
    assert f"profile: steps 2-3 traced to {sessions[0]}" in stdout


def test_sft_on_one_device_has_no_collectives(tmp_path):
    _sft(tmp_path / "run", 1)
    row = _profile_row(tmp_path / "run")
    assert row["profile/collective_fraction"] == 0.0 and row["profile/op_ms"] > 0
