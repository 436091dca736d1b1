"""Learning results of preference tuning on the shipped SmolLM2-135M-Instruct (LoRA): DPO with
the reference taken by switching adapters off, and a reward model, both on the bundled
arithmetic preference pairs (right answer vs a near miss), scored on 200 held-out pairs whose
arithmetic never appears in training.

    .venv/bin/python benchmarks/preference_smollm2.py [--dpo-steps 40] [--reward-steps 40] [--write]

`make test` checks the same code on the tiny preset (tests/recipes/test_dpo_recipe.py).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


def evals(run_dir: Path) -> list[dict]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if "eval_accuracy" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dpo-steps", type=int, default=40)
    parser.add_argument("--reward-steps", type=int, default=40)
    parser.add_argument("--out", default="runs/bench-preference")
    parser.add_argument("--write", action="store_true")
    args = parser.parse_args()
    from hone.config import DPOConfig, RewardConfig, load_config
    from hone.recipes.dpo import run_dpo
    from hone.recipes.reward import run_reward

    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    lines = []
    t0 = time.perf_counter()
    dpo = load_config(DPOConfig, str(ROOT / "configs/smollm2/dpo_lora.yaml"), [
        f"run_dir={out / 'dpo'}", f"train.max_steps={args.dpo_steps}",
        f"train.eval_every={args.dpo_steps // 2}", "log.sinks=[jsonl]",
        f"checkpoint.every_steps={args.dpo_steps}"])
    _, _, ref_bytes = run_dpo(dpo, log=lambda s: print("dpo:", s, flush=True))
    dpo_s = time.perf_counter() - t0
    for r in evals(out / "dpo"):
        lines.append(f"| DPO (sigmoid, beta 0.1, LoRA r16) | {r['step']} | "
                     f"{r['eval_accuracy']:.1%} | {r['eval_margin']:.3f} |")
    t1 = time.perf_counter()
    reward = load_config(RewardConfig, str(ROOT / "configs/smollm2/reward_lora.yaml"), [
        f"run_dir={out / 'reward'}", f"train.max_steps={args.reward_steps}",
        f"train.eval_every={args.reward_steps // 2}", "log.sinks=[jsonl]",
        f"checkpoint.every_steps={args.reward_steps}"])
    run_reward(reward, log=lambda s: print("reward:", s, flush=True))
    reward_s = time.perf_counter() - t1
    for r in evals(out / "reward"):
        lines.append(f"| reward model (LoRA r16 + head) | {r['step']} | "
                     f"{r['eval_accuracy']:.1%} | {r['eval_margin']:.3f} |")
    section = "\n".join([
        "## Preference tuning on SmolLM2", "",
        f"Measured {time.strftime('%Y-%m-%d')} with `benchmarks/preference_smollm2.py "
        f"--dpo-steps {args.dpo_steps} --reward-steps {args.reward_steps}`: SmolLM2-135M-"
        "Instruct (shipped GGUF), LoRA rank 16 on every projection, batch 8 pairs, "
        "builtin:arithmetic-pref; held-out accuracy on the 200 pairs of "
        "builtin:arithmetic-pref-eval. DPO accuracy is the share of pairs whose implicit reward "
        "beta*(log-ratio to the reference) is higher for the right answer (0 at step 0, where "
        "the policy is its reference); reward-model accuracy is the share with the higher "
        "score on the right answer.",
        "",
        "| run | step | held-out accuracy | held-out margin |",
        "|---|---|---|---|",
        *lines,
        "",
        f"DPO: {dpo_s:.0f} s; reference by switching adapters off: {ref_bytes / 2**20:.1f} MiB "
        f"of extra weights. Reward model: {reward_s:.0f} s.",
    ])
    print(section)
    if args.write:
        from _driver import write_section
        write_section("Preference tuning on SmolLM2", section)


if __name__ == "__main__":
    main()
