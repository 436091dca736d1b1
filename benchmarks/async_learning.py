"""Does a policy lag cost learning? GRPO with LoRA on the shipped SmolLM2-135M-Instruct
(configs/smollm2/grpo_lora.yaml) for the same number of steps with grpo.max_staleness 0, 1 and 2,
and a second synchronous run with another seed for the noise band; held-out accuracy (greedy
answers to the config's 100 held-out questions) before and after, one run after the other.

    .venv/bin/python benchmarks/async_learning.py [--steps 12] [key=value ...]

Extra arguments are config overrides applied to every run (e.g. grpo.tis_cap=2.0).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ((0, 0), (0, 1), (1, 0), (2, 0))  # (max_staleness, train.seed)


def run(staleness: int, seed: int, steps: int, run_dir: Path, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "hone.cli", "grpo", "--config",
           str(ROOT / "configs/smollm2/grpo_lora.yaml"), f"run_dir={run_dir}",
           f"train.max_steps={steps}", f"train.eval_every={steps}",
           f"checkpoint.every_steps={steps}", "log.sinks=[jsonl]", f"train.seed={seed}",
           f"grpo.max_staleness={staleness}", *extra]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r["eval_accuracy"] for r in rows if "eval_accuracy" in r}
    trained = [r for r in rows if "reward_mean" in r]
    return {"staleness": staleness, "seed": seed, "before": evals[0], "after": evals[steps],
            "reward_mean": sum(r["reward_mean"] for r in trained) / len(trained),
            "offpolicy_k3": max(r.get("offpolicy_k3", 0.0) for r in trained),
            "wall_s": time.perf_counter() - t0}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for staleness, seed in RUNS:
            rows.append(run(staleness, seed, args.steps, Path(tmp) / f"s{staleness}-{seed}",
                            args.overrides))
            print(json.dumps(rows[-1]), flush=True)
    print("| max_staleness | seed | held-out before | after | mean sampled reward | "
          "max offpolicy_k3 | wall s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['staleness']} | {r['seed']} | {r['before']:.1%} | {r['after']:.1%} | "
              f"{r['reward_mean']:.3f} | {r['offpolicy_k3']:.2e} | {r['wall_s']:.0f} |")
    sync = [r["after"] for r in rows if r["staleness"] == 0]
    print(f"noise band (two synchronous seeds): {abs(sync[0] - sync[1]) * 100:.1f} points")
    for r in rows[2:]:
        print(f"staleness {r['staleness']} - staleness 0 (seed 0): "
              f"{(r['after'] - rows[0]['after']) * 100:+.1f} points (goal within 3)")


if __name__ == "__main__":
    main()
