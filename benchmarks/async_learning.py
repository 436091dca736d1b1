"""Does a policy lag cost learning? GRPO with LoRA on the shipped SmolLM2-135M-Instruct
(configs/smollm2/grpo_lora.yaml) for the same number of steps with grpo.max_staleness 0, 1 and 2,
each with several seeds (train.seed: the sampling keys and the prompt order); held-out accuracy
(greedy answers to the config's 100 held-out questions) before and after, one run after the
other. A lag's cost is the difference of its mean over seeds from staleness 0's; the noise band
is the spread of the synchronous seeds.

    .venv/bin/python benchmarks/async_learning.py [--steps 12] [--seeds 0,1,2]
        [--staleness 0,1,2] [--in-process] [--out rows.jsonl] [key=value ...]
    .venv/bin/python benchmarks/async_learning.py --summarize rows.jsonl [more.jsonl ...]

Extra arguments are config overrides applied to every run (e.g. grpo.tis_cap=2.0). The runs are
deterministic, so a (staleness, seed) pair measured before can be left out with --skip S:SEED
and its recorded figure added by hand.

--in-process runs each `hone grpo` in this process instead of a subprocess: on an accelerator,
where a run's steps take seconds and opening the device, importing and compiling dominate, the
runs share the opened device and (with JAX_COMPILATION_CACHE_DIR set) the compiled programs.
A run's numbers do not depend on which of the two forms ran it. --out appends each finished
run's row to a file as it ends, so a run cut short keeps what it measured.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(staleness: int, seed: int, steps: int, run_dir: Path, extra: list[str],
        in_process: bool = False) -> dict:
    args = ["grpo", "--config", str(ROOT / "configs/smollm2/grpo_lora.yaml"),
            f"run_dir={run_dir}", f"train.max_steps={steps}", f"train.eval_every={steps}",
            f"checkpoint.every_steps={steps}", "log.sinks=[jsonl]", f"train.seed={seed}",
            f"grpo.max_staleness={staleness}", *extra]
    t0 = time.perf_counter()
    if in_process:
        from hone.cli import main as hone_main

        with contextlib.redirect_stdout(io.StringIO()):
            code = hone_main(args)
        if code:
            raise SystemExit(f"hone {' '.join(args)} exited with {code}")
    else:
        subprocess.run([sys.executable, "-m", "hone.cli", *args], check=True,
                       stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval_accuracy"] for r in rows if "eval_accuracy" in r}
    trained = [r for r in rows if "reward_mean" in r]
    return {"staleness": staleness, "seed": seed, "before": evals[0], "after": evals[steps],
            "reward_mean": sum(r["reward_mean"] for r in trained) / len(trained),
            "offpolicy_k3": max(r.get("offpolicy_k3", 0.0) for r in trained),
            "wall_s": time.perf_counter() - t0}


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--seeds", type=_ints, default=[0, 1, 2])
    ap.add_argument("--staleness", type=_ints, default=[0, 1, 2])
    ap.add_argument("--skip", action="append", default=[],
                    help="S:SEED, a run to leave out (measured before)")
    ap.add_argument("--in-process", action="store_true",
                    help="each run in this process (shares the device and compiled programs)")
    ap.add_argument("--out", type=Path, help="append each run's row to this JSONL file")
    ap.add_argument("--summarize", type=Path, nargs="+", metavar="ROWS",
                    help="run nothing: summarize rows recorded with --out")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    if args.summarize:
        summarize([json.loads(line) for path in args.summarize
                   for line in path.read_text().splitlines() if line.strip()])
        return
    skip = {tuple(_ints(x.replace(":", ","))) for x in args.skip}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        # Seed by seed, each seed's lags together: a sweep cut short leaves whole pairs.
        for seed in args.seeds:
            for staleness in args.staleness:
                if (staleness, seed) in skip:
                    continue
                rows.append(run(staleness, seed, args.steps, Path(tmp) / f"s{staleness}-{seed}",
                                args.overrides, args.in_process))
                print(json.dumps(rows[-1]), flush=True)
                if args.out:
                    with args.out.open("a") as f:
                        f.write(json.dumps(rows[-1]) + "\n")
    summarize(rows)


def summarize(rows: list[dict]) -> None:
    """The runs' table, each lag's mean and spread, and each lag's cost paired by seed: the mean
    over the seeds run both at that lag and at staleness 0 of the difference in held-out
    accuracy, with its standard error."""
    print("| max_staleness | seed | held-out before | after | mean sampled reward | "
          "max offpolicy_k3 | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['staleness']} | {r['seed']} | {r['before']:.1%} | {r['after']:.1%} | "
              f"{r['reward_mean']:.3f} | {r['offpolicy_k3']:.2e} | {r['wall_s']:.0f} |")
    after = {}
    for r in rows:
        after.setdefault(r["staleness"], {})[r["seed"]] = r["after"]
    # Means and spreads over the seeds run at every lag, so that the lags compare like for like.
    complete = set.intersection(*(set(by_seed) for by_seed in after.values())) if after else set()
    left_out = sum(len(set(by_seed) - complete) for by_seed in after.values())
    if left_out:
        print(f"{left_out} run(s) of seeds not run at every lag: left out of the means below")
    after = {s: {seed: v for seed, v in by_seed.items() if seed in complete}
             for s, by_seed in after.items()}
    for s, by_seed in sorted(after.items()):
        if not by_seed:
            continue
        values = list(by_seed.values())
        spread = f", standard deviation {statistics.stdev(values) * 100:.1f} points" \
            if len(values) > 1 else ""
        print(f"staleness {s}: mean {statistics.mean(values):.1%} over {len(values)} seeds, "
              f"{min(values):.1%} to {max(values):.1%}{spread}")
    sync = after.get(0, {})
    if len(sync) > 1:
        band = max(sync.values()) - min(sync.values())
        print(f"noise band (synchronous seeds): {band * 100:.1f} points")
    for s, by_seed in sorted(after.items()):
        if not s or not sync:
            continue
        # Every lag holds the same (complete) seeds by now.
        diffs = [(by_seed[seed] - sync[seed]) * 100 for seed in by_seed]
        error = (f", standard error {statistics.stdev(diffs) / math.sqrt(len(diffs)):.1f}"
                 if len(diffs) > 1 else "")
        print(f"staleness {s} - staleness 0, paired over {len(diffs)} seeds: "
              f"{statistics.mean(diffs):+.1f} points{error} (goal within 3)")


if __name__ == "__main__":
    main()
