"""Two processes x 4 host devices train exactly like one process x 8 devices.

`hone sft` is started three times as separate programs (the device count and
`jax.distributed` are fixed per process): twice on loopback as processes 0 and 1 of one run,
then once alone. The loss trajectories must agree to 1e-5 relative over 10 steps, and the
two-process run must leave the checkpoints of steps 5 and 10 (Orbax saves from both processes
into one folder). Every child runs in its own session and is killed with its process group if
anything goes wrong, so a hung collective never outlives the test.

The settings resolution of `hone.parallel.distributed` is checked in-process, without JAX.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hone.config.schema import DistributedSection
from hone.errors import InputError
from hone.parallel import initialize
from hone.parallel.distributed import ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID, resolve

from hostenv import host_devices_env

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 240  # a safety net for a hung run; the whole test takes well under a minute
ENV_NAMES = (ENV_COORDINATOR, ENV_NUM_PROCESSES, ENV_PROCESS_ID)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sft(run_dir: Path, devices: int, log: Path, *extra: str) -> subprocess.Popen:
    env = host_devices_env(devices, {k: v for k, v in os.environ.items() if k not in ENV_NAMES})
    cmd = [sys.executable, "-m", "hone.cli", "sft", "--config", "configs/tiny/sft.yaml",
           f"run_dir={run_dir}", "train.max_steps=10", "train.eval_every=0",
           "checkpoint.every_steps=5", "log.sinks=[jsonl]", *extra]
    with open(log, "w") as out:  # a file, not a pipe: gloo's chatter can never block a child
        return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)


def run_together(starts: list, logs: list[Path]) -> None:
    """Start every process and wait for all. On a timeout, or as soon as one fails (its peers
    would otherwise wait minutes for it in a collective), kill every process group still
    running; then check that each exited cleanly."""
    procs: list[subprocess.Popen] = []
    try:
        for start in starts:
            procs.append(start())
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]  # poll each: any() would stop at the first
            if None not in codes or any(codes):
                break
            time.sleep(0.2)
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    failed = [f"{log.name} exited {p.returncode}:\n{log.read_text()[-2000:]}"
              for p, log in zip(procs, logs) if p.returncode]
    assert not failed, "\n".join(failed)


def losses(run_dir: Path) -> tuple[list[int], np.ndarray]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "loss" in r]
    return [r["step"] for r in rows], np.array([r["loss"] for r in rows])


def test_two_processes_match_one_process_and_checkpoint(tmp_path):
    multi, single = tmp_path / "multi", tmp_path / "single"
    together = [f"distributed.coordinator=127.0.0.1:{free_port()}", "distributed.num_processes=2"]
    logs = [tmp_path / f"process{i}.log" for i in range(2)]
    t0 = time.perf_counter()
    run_together([lambda i=i: start_sft(multi, 4, logs[i], *together,
                                        f"distributed.process_id={i}") for i in range(2)], logs)
    t1 = time.perf_counter()
    one_log = tmp_path / "single.log"
    run_together([lambda: start_sft(single, 8, one_log)], [one_log])
    t2 = time.perf_counter()
    print(f"\n2 processes x 4 devices: {t1 - t0:.1f} s; 1 process x 8 devices: {t2 - t1:.1f} s")

    steps, got = losses(multi)
    want_steps, want = losses(single)
    assert steps == want_steps == list(range(1, 11))
    np.testing.assert_allclose(got, want, rtol=1e-5)
    assert sorted(p.name for p in (multi / "checkpoints").iterdir()) == ["10", "5"]
    assert (multi / "config.yaml").is_file()
    # Only process 0 prints; process 1's log holds nothing from hone itself.
    assert "done:" in logs[0].read_text() and "done:" not in logs[1].read_text()
    assert "data:" not in logs[1].read_text()


# ---- settings resolution ---------------------------------------------------------------------

@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV_NAMES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_nothing_configured_is_one_process(clean_env):
    assert resolve(DistributedSection()) is None
    assert initialize(DistributedSection()) is False


def test_config_and_environment_settings(clean_env):
    section = DistributedSection(coordinator="10.0.0.1:1234", num_processes=4, process_id=3)
    assert resolve(section) == dict(coordinator_address="10.0.0.1:1234", num_processes=4,
                                    process_id=3)
    clean_env.setenv(ENV_COORDINATOR, "10.0.0.2:99")
    clean_env.setenv(ENV_NUM_PROCESSES, "2")
    clean_env.setenv(ENV_PROCESS_ID, "1")
    assert resolve(DistributedSection()) == dict(coordinator_address="10.0.0.2:99",
                                                 num_processes=2, process_id=1)
    # The config wins over the environment, key by key.
    assert resolve(DistributedSection(process_id=0))["process_id"] == 0


def test_auto_passes_only_what_is_given(clean_env):
    assert resolve(DistributedSection(auto=True)) == {}
    assert resolve(DistributedSection(auto=True, num_processes=8)) == {"num_processes": 8}


@pytest.mark.parametrize("kwargs, env, key", [
    (dict(coordinator="h:1"), {}, "distributed.num_processes"),
    (dict(coordinator="h:1", num_processes=2), {}, "distributed.process_id"),
    (dict(coordinator="h:1", num_processes=2, process_id=2), {}, "distributed.process_id"),
    (dict(coordinator="localhost", num_processes=2, process_id=0), {}, "distributed.coordinator"),
    (dict(num_processes=2, process_id=0), {}, "distributed.process_id"),
    (dict(num_processes=2), {}, "distributed.num_processes"),
    (dict(coordinator="h:1"), {ENV_NUM_PROCESSES: "two"}, "distributed.num_processes"),
    (dict(coordinator="h:1", num_processes=2), {ENV_PROCESS_ID: "5"}, "distributed.process_id"),
])
def test_inconsistent_settings_name_the_key(clean_env, kwargs, env, key):
    for name, value in env.items():
        clean_env.setenv(name, value)
    with pytest.raises(InputError) as e:
        resolve(DistributedSection(**kwargs))
    assert e.value.key == key
