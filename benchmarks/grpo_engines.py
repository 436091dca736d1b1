"""A GRPO step of configs/smollm2/grpo_lora.yaml with up to 256 new tokens, its rollouts from the
static sampler and from the paged rollout engine: one `hone grpo` run of each, one after the
other, the same settings otherwise (5 steps, no checkpoints, one held-out prompt).

Reported per engine over steps 2..5 (step 1 compiles): the medians of rollout_s and update_s
from metrics.jsonl, their sum (the step), the rollout's tokens per second (completions' tokens
/ rollout_s) and the process's peak RSS. The two runs sample different completions (each
engine draws its own keys), so their lengths differ; tokens per second compares them.

    .venv/bin/python benchmarks/grpo_engines.py [--steps 5] [--new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run(engine: str, steps: int, new_tokens: int, run_dir: Path) -> dict:
    cmd = [sys.executable, "-m", "hone.cli", "grpo", "--config",
           str(ROOT / "configs/smollm2/grpo_lora.yaml"), f"run_dir={run_dir}",
           f"grpo.max_new_tokens={new_tokens}", f"train.max_steps={steps}",
           "train.eval_every=1000", "grpo.eval_prompts=1", "checkpoint.every_steps=1000",
           "log.sinks=[jsonl]", f"grpo.engine={engine}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps_ = [r for r in rows if r.get("step", 0) >= 2 and "rollout_s" in r]
    batch = 32  # train.batch_size of the config: completions per step
    rollout = statistics.median(r["rollout_s"] for r in steps_)
    update = statistics.median(r["update_s"] for r in steps_)
    return {"engine": engine, "rollout_s": rollout, "update_s": update,
            "step_s": statistics.median(r["rollout_s"] + r["update_s"] for r in steps_),
            "rollout_tokens_per_s": statistics.median(
                batch * r["completion_len_mean"] / r["rollout_s"] for r in steps_),
            "completion_len_mean": statistics.mean(r["completion_len_mean"] for r in steps_),
            # the largest child so far (the paged run's figure holds if it is the larger)
            "peak_rss_mb": max(before, peak) / 1024}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--new-tokens", type=int, default=256)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [run(e, args.steps, args.new_tokens, Path(tmp) / e) for e in ("static", "paged")]
    print("| engine | step s | rollout s | update s | rollout tokens/s | mean completion |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['engine']} | {r['step_s']:.1f} | {r['rollout_s']:.1f} | {r['update_s']:.1f} "
              f"| {r['rollout_tokens_per_s']:.0f} | {r['completion_len_mean']:.0f} |")
    s, p = rows
    print(f"paged / static: step {s['step_s'] / p['step_s']:.2f}x, rollout tokens/s "
          f"{p['rollout_tokens_per_s'] / s['rollout_tokens_per_s']:.2f}x")
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
