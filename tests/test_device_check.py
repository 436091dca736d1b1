"""scripts/device_check.py --smoke on this CPU: the device check's code paths run in CI, so the
script a GPU or TPU session runs once has not rotted. The tiny model against a CPU subprocess of
itself must agree exactly (both sides are this CPU), and the one bench row must report MFU."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_smoke_run_writes_a_passing_report(tmp_path):
    out = tmp_path / "report.json"
    done = subprocess.run([sys.executable, str(ROOT / "scripts/device_check.py"), "--smoke",
                           "--out", str(out), "--work", str(tmp_path / "work")], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (done.stdout[-3000:], done.stderr[-3000:])
    report = json.loads(out.read_text())
    checks = report["checks"]
    assert report["ok"] and report["smoke"]
    assert set(checks) == {"logits", "generate", "resume", "bench_sft",
                           "bench_rollout_long-tail_paged"}
    assert report["env"]["backend"] == report["device"]["backend"] == "cpu"
    # Both sides computed on this CPU: the same program, the same numbers.
    for dtype in ("float32", "bfloat16"):
        assert checks["logits"][dtype]["max_abs_diff"] == 0.0
        assert checks["logits"][dtype]["top1_agreement"] == 1.0
    assert checks["logits"]["shape"][-1] == 264  # the tiny preset's vocabulary
    assert checks["generate"] == {**checks["generate"], "identical": True, "new_tokens": 8,
                                  "first_difference": [None, None]}
    assert checks["resume"]["skipped"] == "--smoke"
    row = checks["bench_sft"]
    assert (row["row"], row["model"], row["batch"], row["seq"]) == ("sft", "tiny", 2, 16)
    assert 0 < row["mfu"] and row["mfu_vs_peak"] is None  # no peak known for a CPU
    rollout = checks["bench_rollout_long-tail_paged"]
    assert (rollout["engine"], rollout["workload"], rollout["later_programs"]) == (
        "paged", "long-tail", 0)
    # One blocking read a window; the last window out (stopped rows only) is not read.
    assert rollout["windows"] >= 1
    assert rollout["windows"] - 1 <= rollout["host_waits"] <= rollout["windows"]
    assert rollout["programs"] > 0
    # The CPU reference was written by the subprocess and kept in --work.
    assert (tmp_path / "work" / "cpu_reference.npz").is_file()


def test_peak_table_names_the_h200_and_tpus():
    spec = importlib.util.spec_from_file_location("device_check", ROOT / "scripts/device_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    peak_tflops = module.peak_tflops
    assert peak_tflops("NVIDIA H200") == 989.0
    assert peak_tflops("NVIDIA H100 PCIe") == 756.0
    assert peak_tflops("NVIDIA H100 80GB HBM3") == 989.0
    assert peak_tflops("TPU v5 lite") == 197.0 and peak_tflops("TPU v5p") == 459.0
    assert peak_tflops("cpu") is None
