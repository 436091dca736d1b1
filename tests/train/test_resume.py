"""Exact resume: tiny DPO (LoRA adapters, precomputed reference) and reward-model runs killed
with SIGKILL after a checkpoint, and a packed SFT run stopped by SIGTERM, started again end with
the same metrics.jsonl losses and bit-identical parameters as an uninterrupted run."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hone.checkpoint import Checkpointer

ROOT = Path(__file__).resolve().parents[2]
# Long enough that the kill lands mid-run, after the first checkpoint: a tiny step takes about
# 50 ms here, so the 50 steps after the first checkpoint (the 30 after the SIGTERM test's 30th
# logged step) give a kill polled every 10 ms seconds to land.
STEPS = 60
BASE = [f"train.max_steps={STEPS}", "checkpoint.every_steps=10", "log.sinks=[jsonl]",
        "data.max_records=64", "data.eval_path=null", "train.batch_size=4",
        "checkpoint.keep=5"]
# Each variant costs three processes, so each one covers several paths: adapters and DPO's
# cached reference together; DPO's in-step reference is covered by the recipe tests. Plain SFT
# and agentic GRPO: tests/train/test_fault_script.py; packed SFT: the SIGTERM test below.
VARIANTS = {
    "dpo-precomputed-lora": ["dpo", "dpo.reference=precomputed", "model.lora.rank=4"],
    "reward": ["reward"],
}


def command(run_dir, extra):
    name = extra[0] if extra and extra[0] in ("dpo", "reward") else "sft"
    extra = extra[1:] if name != "sft" else extra
    return [sys.executable, "-m", "hone.cli", name, "--config",
            str(ROOT / f"configs/tiny/{name}.yaml"), f"run_dir={run_dir}", *BASE, *extra]


def losses(run_dir) -> list[str]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    # Compare the exact text of each loss: byte-identical values, not approximate ones.
    return [f'{json.loads(l)["step"]}:{json.loads(l)["loss"]!r}' for l in lines]


def final_state(run_dir):
    ckpt = Checkpointer(Path(run_dir) / "checkpoints", keep=5, async_save=False)
    step = ckpt.latest_step()
    state, _ = ckpt.read(step)
    ckpt.close()
    return step, state


def kill_after_first_checkpoint(run_dir, extra):
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen(command(run_dir, extra), cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 240
        first = Path(run_dir) / "checkpoints" / "10"
        while not (first / "commit_success.txt").exists() and not (first / "state").exists():
            assert proc.poll() is None, "run ended before its first checkpoint"
            assert time.time() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_killed_run_resumes_exactly(variant, tmp_path):
    extra = VARIANTS[variant]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    subprocess.run(command(straight, extra), cwd=ROOT, check=True, capture_output=True)
    kill_after_first_checkpoint(killed, extra)
    assert not (killed / "checkpoints" / str(STEPS)).exists()
    subprocess.run(command(killed, extra), cwd=ROOT, check=True, capture_output=True)
    assert losses(killed) == losses(straight)
    (s1, a), (s2, b) = final_state(straight), final_state(killed)
    assert s1 == s2 == STEPS
    for k in a["params"]:
        assert np.array_equal(np.asarray(a["params"][k]), np.asarray(b["params"][k])), k
    if variant == "dpo-precomputed-lora":
        assert all("lora" in k for k in a["params"])


def test_sigterm_saves_then_stops_and_resumes_exactly(tmp_path):
    """On packed rows, so the packing iterator's position is part of what resumes."""
    straight, stopped, packed = tmp_path / "straight", tmp_path / "stopped", ["data.pack=true"]
    subprocess.run(command(straight, packed), cwd=ROOT, check=True, capture_output=True)
    proc = subprocess.Popen(command(stopped, packed), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 240
        while not (stopped / "metrics.jsonl").exists() or \
                len((stopped / "metrics.jsonl").read_text().splitlines()) < 30:
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1 and "checkpoint saved" in err
    saved = max(int(p.name) for p in (stopped / "checkpoints").iterdir() if p.name.isdigit())
    last_logged = json.loads((stopped / "metrics.jsonl").read_text().splitlines()[-1])["step"]
    assert 30 <= saved == last_logged < STEPS  # saved at the step where the signal stopped it
    subprocess.run(command(stopped, packed), cwd=ROOT, check=True, capture_output=True)
    assert losses(stopped) == losses(straight)
