"""Learning results of distillation on the shipped SmolLM2-135M-Instruct: a 15-block student cut
from the 30-block teacher (every other block) learns the teacher's answer distribution on the
bundled arithmetic chat set. Reports held-out KL(teacher || student), the student's and the
teacher's perplexity, top-1 agreement, cosine of the final hidden states and greedy answer
agreement, at step 0 and every `train.eval_every` steps, with the wall time.

    .venv/bin/python benchmarks/distill_smollm2.py [--steps 400] [--write] [key=value ...]

Extra arguments are config overrides of configs/smollm2/distill.yaml. `make test` checks the
same code on the tiny preset (tests/recipes/test_distill_recipe.py).
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
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--out", default="runs/bench-distill")
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--report-only", action="store_true",
                        help="format the results of the run already in --out")
    parser.add_argument("--seconds", type=float, default=None,
                        help="with --report-only: the run's wall time, if known")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    from hone.config import DistillConfig, load_config
    from hone.recipes.distill import run_distill

    out = Path(args.out)
    cfg = load_config(DistillConfig, str(ROOT / "configs/smollm2/distill.yaml"), [
        f"run_dir={out}", f"train.max_steps={args.steps}", "log.sinks=[console,jsonl]",
        *args.overrides])
    seconds = args.seconds
    if not args.report_only:
        shutil.rmtree(out, ignore_errors=True)
        t0 = time.perf_counter()
        run_distill(cfg, log=lambda s: print("distill:", s, flush=True))
        seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval_kl" in r]
    train = [r for r in rows if "loss" in r]
    lines = [f"| {r['step']} | {r['eval_kl']:.3f} | {r['eval_ppl']:.2f} | "
             f"{r['eval_top1_agree']:.1%} | {r.get('eval_cos', float('nan')):.3f} | "
             f"{r.get('eval_answer_agree', float('nan')):.1%} | "
             f"{r.get('eval_accuracy', float('nan')):.1%} |" for r in evals]
    d = cfg.distill
    first, last = evals[0]["eval_kl"], evals[-1]["eval_kl"]
    tokens = sum(r.get("tokens_per_s", 0) for r in train) / max(len(train), 1)
    section = "\n".join([
        "## Distillation on SmolLM2", "",
        f"Measured {time.strftime('%Y-%m-%d')} with `benchmarks/distill_smollm2.py --steps "
        f"{args.steps}{''.join(' ' + o for o in args.overrides)}`: teacher SmolLM2-135M-Instruct "
        f"(shipped GGUF, 30 blocks, frozen, {cfg.teacher.dtype}); student initialised from "
        f"teacher blocks {list(d.student_layers)} ({len(d.student_layers)} blocks, every "
        f"parameter trained), {d.mode} {d.kind} at temperature {d.temperature}, batch "
        f"{cfg.train.batch_size} x {cfg.data.max_length} tokens, AdamW lr {cfg.train.lr} "
        f"(cosine, {cfg.train.warmup_steps} warmup steps); loss and held-out metrics on the "
        f"answer tokens of builtin:arithmetic-eval ({cfg.train.eval_batches or 'all'} "
        f"batches); greedy answers to its first {d.eval_prompts} questions. Teacher perplexity on the same "
        f"tokens: {evals[0]['eval_teacher_ppl']:.2f}; teacher accuracy "
        f"{evals[0].get('eval_teacher_accuracy', float('nan')):.1%}.",
        "",
        "| step | KL(teacher ‖ student) | student ppl | top-1 agreement | cos(final hidden) "
        "| same final answer | student accuracy |",
        "|---|---|---|---|---|---|---|",
        *lines,
        "",
        f"Held-out KL {first:.3f} -> {last:.3f} nats per answer token "
        f"({last / first:.0%} of the start)"
        + (f" in {seconds / 60:.1f} minutes of wall time, evaluations included"
           if seconds else "")
        + f"; {tokens:.0f} training tokens/s on average.",
    ])
    print(section)
    if args.write:
        from _driver import write_section
        write_section("Distillation on SmolLM2", section)


if __name__ == "__main__":
    main()
