"""Learning results of RL with LoRA on the shipped SmolLM2-135M-Instruct (GRPO or PPO): held-out
accuracy on the bundled arithmetic word problems (greedy answers to 100 questions whose
arithmetic never appears in training) before training and every `train.eval_every` steps, the
training curve, and the wall time.

    .venv/bin/python benchmarks/rl_smollm2.py --algo grpo [--steps 60] [--write] [key=value ...]
    .venv/bin/python benchmarks/rl_smollm2.py --algo ppo --steps 20 [--write]

Extra arguments are config overrides of configs/smollm2/<algo>_lora.yaml. `make test` checks the
same code on the tiny preset (tests/recipes/test_rl_recipes.py).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algo", choices=("grpo", "ppo"), default="grpo")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", default=None, help="run folder (default runs/bench-ALGO)")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--seconds", type=float, default=None,
                        help="with --report-only: the run's wall time, if known")
    parser.add_argument("--report-only", action="store_true",
                        help="format the results of the run already in --out (stopped early)")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from hone.config import COMMANDS, load_config
    from hone.recipes.grpo import run_grpo
    from hone.recipes.ppo import run_ppo

    out = Path(args.out or f"runs/bench-{args.algo}")
    run = run_grpo if args.algo == "grpo" else run_ppo
    cfg = load_config(COMMANDS[args.algo], str(ROOT / f"configs/smollm2/{args.algo}_lora.yaml"), [
        f"run_dir={out}", f"train.max_steps={args.steps}", "log.sinks=[console,jsonl]",
        *args.overrides])
    seconds = args.seconds
    if not args.report_only:
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        run(cfg, log=lambda s: print(f"{args.algo}:", s, flush=True))
        seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_accuracy" in r]
    train = [r for r in rows if "loss" in r]
    g = getattr(cfg, args.algo)
    name = args.algo.upper()
    lines = [f"| {r['step']} | {r['eval_accuracy']:.1%} | {r['eval_completion_len']:.1f} |"
             for r in evals]
    curve = []
    for k in range(0, len(train), 10):
        chunk = train[k:k + 10]
        mean = lambda key: sum(r.get(key, 0.0) for r in chunk) / len(chunk)  # noqa: E731
        third = (f"{mean('zero_std_fraction'):.2f}" if args.algo == "grpo"
                 else f"{mean('kl_seq'):.3f}")
        curve.append(f"| {chunk[0]['step']}-{chunk[-1]['step']} | {mean('reward_mean'):.3f} | "
                     f"{mean('accuracy'):.1%} | {mean('completion_len_mean'):.1f} | {third} | "
                     f"{mean('rollout_s'):.1f} | {mean('update_s'):.1f} | "
                     f"{max(r['sampler_gap'] for r in chunk):.1e} |")
    first, last = evals[0]["eval_accuracy"], evals[-1]["eval_accuracy"]
    if args.algo == "grpo":
        algo = (f"beta {g.beta}, {g.loss_agg}, clip {g.clip_eps}/{g.clip_eps_high}")
    else:
        algo = (f"{g.critic} critic, kl_coef {g.kl_coef}, gamma {g.gamma}, lambda {g.lam}, "
                f"{g.epochs} epochs x {g.minibatches} minibatches, vf_coef {g.vf_coef}")
    section = "\n".join([
        f"## {name} on SmolLM2", "",
        f"Measured {time.strftime('%Y-%m-%d')} with `benchmarks/rl_smollm2.py --algo "
        f"{args.algo} --steps {args.steps}{''.join(' ' + o for o in args.overrides)}`: "
        "SmolLM2-135M-Instruct (shipped GGUF), LoRA rank 16 on every projection, "
        f"{cfg.train.batch_size // g.group_size} prompts x {g.group_size} samples per step, "
        f"{g.max_new_tokens} new tokens, temperature {g.temperature}, {algo}, "
        f"lr {cfg.train.lr}; reward: the final number equals the answer. Held-out accuracy: "
        f"greedy answers to the first {g.eval_prompts} questions of "
        "builtin:arithmetic-rl-eval.",
        "",
        "| step | held-out accuracy | mean answer tokens |",
        "|---|---|---|",
        *lines,
        "",
        f"Held-out accuracy {first:.1%} -> {last:.1%} ({(last - first) * 100:+.1f} points)"
        + (f" in {seconds / 60:.1f} minutes of wall time, evaluations included." if seconds
           else "."),
        "",
        "Training curve (means over 10 steps: reward and accuracy of the sampled completions, "
        "their length in tokens, "
        + ("the share of groups whose rewards were all equal" if args.algo == "grpo" else
           "the KL to the reference per completion")
        + ", seconds per rollout and per update; the largest sampler-versus-trainer "
        "log-probability gap per token):",
        "",
        "| steps | reward | sampled accuracy | tokens | "
        + ("zero-std groups" if args.algo == "grpo" else "KL") + " | rollout s | update s | gap |",
        "|---|---|---|---|---|---|---|---|",
        *curve,
    ])
    print(section)
    if args.write:
        from _driver import write_section
        write_section(f"{name} on SmolLM2", section)


if __name__ == "__main__":
    main()
