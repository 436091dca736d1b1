"""scripts/fault_test.py at small scale: one SIGKILL trial each of agentic GRPO (multi-turn
episodes, killed inside a checkpoint write) and SFT of the mixture-of-experts tiny-moe (killed
at a random moment after a logged step; the agent run's 4 steps are too few for that), each
killed once and resumed, bit-identical to the uninterrupted one. The MoE run is a dense SFT run
plus routed experts and router losses, so it stands for both; GRPO's single-turn path shares the
loop, step and checkpoint with the agentic one, and DPO's SIGKILL resume is
tests/train/test_resume.py's dpo-precomputed-lora case. The full script (`--trials 24`, behind
docs/RELIABILITY.md) runs every algorithm and every kill mode; `--algos moe,moe_dpo,moe_grpo`
the mixture-of-experts ones."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_killed_runs_resume_bit_identical(tmp_path):
    out = subprocess.run([sys.executable, str(ROOT / "scripts/fault_test.py"), "--trials", "2",
                          "--max-kills", "1", "--seed", "1", "--algos", "agent,moe",
                          "--work", str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=900)
    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
    trials = [l for l in lines if "trial" in l]
    summary = lines[-1]["summary"]
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert [t["algo"] for t in trials] == ["agent", "moe"]
    assert all(t["identical_state"] and t["identical_metrics"] for t in trials), trials
    assert summary["trials"] == summary["ok"] == 2
    first = [t["kills"][0] for t in trials]
    assert [k["mode"] for k in first] == ["save", "step"]
    # The "save" kill lands while Orbax's temporary folder of a checkpoint exists.
    assert first[0]["in_checkpoint_write"] and first[0]["killed"], first
    assert first[1]["killed"] and first[1]["logged_step"] >= 1, first
