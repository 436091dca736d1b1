"""Training-step benchmark: hone vs Tunix vs PyTorch/transformers, side by side.

Rows: sft (full fine-tuning) and lora (rank 16, alpha 32 on q/k/v/o and gate/up/down, base
frozen); SmolLM2-135M shape, random init, fp32, batch B x T random tokens, AdamW with global-norm
clipping at 1.0. Runs train_hone.py, train_tunix.py (in the Tunix venv, created by _venvs.py if
missing) and train_torch.py as separate processes, one per (implementation, row) so peak RSS is
per row, one after another and never in parallel, rotating the order of implementations every
round. Each process times the first step (compile) and the median of --repeats steps; this
driver takes the median over rounds per (impl, row), prints markdown tables with the ratios
hone/tunix and hone/torch, and with --write rewrites the "## Training steps" section of
benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/train.py --write
    .venv/bin/python benchmarks/train.py --rounds 1 --repeats 1   # smoke
    .venv/bin/python benchmarks/train.py --bf16                   # also hone with bf16 compute
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402

IMPLS = ("hone", "tunix", "torch")
ROWS = ("sft", "lora")
GOALS = {"tunix": 2.0, "torch": 2.5}  # hone's step at least this many times faster


def jobs(impl: str, args) -> list[tuple[str, list[str]]]:
    """One process per row; with --bf16, hone also runs each row with --precision bf16."""
    out = []
    for row in args.rows:
        cmd = _driver.command(impl, f"train_{impl}.py", "--rows", row, "--repeats", args.repeats,
                              "--batch", args.batch, "--seq-len", args.seq_len)
        out.append((f"{impl} {row}", cmd))
        if impl == "hone" and args.bf16:
            out.append((f"hone {row}-bf16", cmd + ["--precision", "bf16"]))
    return out


def bullets(vers: dict) -> dict[str, str]:
    return {
        "hone": "- hone: the jitted step of `hone.train.step.make_train_step` with "
                "`hone.recipes.sft.sft_step_loss` (what `hone sft` runs), on "
                "`hone.load_model(\"smollm2-135m\")`, LoRA by `hone.models.lora.apply_lora`; "
                "timed: `step(state, frozen, batch)` until its metrics are ready; "
                f"jax {vers['jax']}, flax {vers['flax']}.",
        "tunix": "- tunix: `tunix.sft.peft_trainer.PeftTrainer`'s jitted train step (as "
                 "`train()` builds it, called on the prepared batch; timed until loss and grad "
                 "norm are ready; the loop's Python bookkeeping and dispatch overlap are not "
                 "included) on `tunix.models.llama3` Llama3, LoRA by qwix "
                 f"`apply_lora_to_model`; google-tunix {vers['tunix']}.",
        "torch": "- torch: transformers `LlamaForCausalLM` (sdpa, 2 threads): forward with "
                 "labels, `backward`, `clip_grad_norm_`, `torch.optim.AdamW.step`, `zero_grad`,"
                 " `loss.item()`; LoRA by peft `get_peft_model`; torch "
                 f"{vers['torch']}, transformers {vers['transformers']}, peft {vers['peft']}.",
    }


def summarize(rows: list[dict], impls, names, tokens: int) -> dict:
    summary = _driver.aggregate(rows, [(i, n) for i in impls for n in names],
                                lambda r: (r["impl"], r["row"]))
    for s in summary.values():
        s["tokens_per_s"] = tokens / s["median_s"]
    return summary


def base_row(name: str) -> str:
    return name.replace("-bf16", "")  # "sft-bf16" is compared with the others' fp32 "sft"


def ratio(summary, name, other):
    """How many times faster hone's step is than `other`'s (their median / hone's median)."""
    if ("hone", name) in summary and (other, base_row(name)) in summary:
        return summary[other, base_row(name)]["median_s"] / summary["hone", name]["median_s"]
    return None


def speed_table(summary, impls, names) -> str:
    head = (["row"] + [f"{i} step s" for i in impls] + [f"{i} tok/s" for i in impls]
            + ["hone/tunix", "hone/torch"])
    rows = []
    for n in names:
        cells = [n]
        cells += [_driver.cell(summary, (i, n), "median_s", ".3f") for i in impls]
        cells += [_driver.cell(summary, (i, n), "tokens_per_s", ".1f") for i in impls]
        for other in ("tunix", "torch"):
            r = ratio(summary, n, other)
            mark = "*" if n != base_row(n) else ""
            cells.append("-" if r is None else f"{r:.2f}x{mark}")
        rows.append(cells)
    return _driver.md_table(head, rows)


def cost_table(summary, impls, names) -> str:
    head = (["row"] + [f"{i} first step s" for i in impls]
            + [f"{i} peak RSS MB" for i in impls])
    rows = [[n] + [_driver.cell(summary, (i, n), "first_s", ".1f") for i in impls]
            + [_driver.cell(summary, (i, n), "peak_rss_mb", ".0f") for i in impls]
            for n in names]
    return _driver.md_table(head, rows)


def goal_lines(summary, rows, impls) -> list[str]:
    wanted = " and ".join(f"{g:g}x {'Tunix' if o == 'tunix' else 'PyTorch'}"
                          for o, g in GOALS.items())
    out = [f"Goal: hone's fp32 training step is at least {wanted} (median step time, every "
           "row)."]
    for row in rows:
        for other, goal in GOALS.items():
            if other not in impls:
                continue
            r = ratio(summary, row, other)
            label = "Tunix" if other == "tunix" else "PyTorch"
            if r is None:
                out.append(f"- {row}: vs {label}: not measured")
            else:
                out.append(f"- {row}: {r:.2f}x {label} (goal {goal:g}x): "
                           f"{'met' if r >= goal else 'NOT met'}")
    return out


def main():
    ap = _driver.parser(__doc__, IMPLS, "Training steps")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--bf16", action="store_true",
                    help="also run hone with --precision bf16 (rows sft-bf16, lora-bf16)")
    args = _driver.parse(ap, IMPLS)
    impls = args.impls
    args.rows = rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    if args.bf16 and "hone" not in impls:
        ap.error("--bf16 runs hone: include hone in --impls")

    # A shape other than the default 4 x 128 gets its own row names ("sft 1x2048"), RESULTS.md
    # section and figure records, so it never replaces the default shape's.
    tag = "" if (args.batch, args.seq_len) == (4, 128) else f" {args.batch}x{args.seq_len}"
    if tag:
        args.title += f", {args.batch} x {args.seq_len}"
    results = _driver.run_rounds(args, lambda impl: jobs(impl, args))
    for r in results:
        r["row"] += tag
    names = [r + tag for r in rows] + ([f"{r}-bf16{tag}" for r in rows] if args.bf16 else [])
    summary = summarize(results, impls, names, args.batch * args.seq_len)
    vers = _driver.versions(main_pkgs=("jax", "flax", "torch", "transformers", "peft"))
    settings = (f"one optimizer step on {args.batch} x {args.seq_len} random tokens (all real, "
                "loss on every token: hone scores all T targets of a row, Tunix's default loss "
                "and transformers' shifted labels score T-1), AdamW (lr 1e-4, betas 0.9/0.999, "
                "eps 1e-8, weight decay 0.01) after global-norm clipping at 1.0, fp32; sft: "
                "every parameter trained; lora: rank 16, alpha 32 on q/k/v/o and gate/up/down, "
                f"base frozen. Median over {args.rounds} round(s) of each process's median of "
                f"{args.repeats} timed step(s) after one first (compiling) step; one process per "
                "implementation and row, run one at a time, order rotated per round. Peak RSS "
                "is the process's peak resident memory (model, optimizer state, compile).")
    notes, flags = [], " --bf16" if args.bf16 else ""
    if tag:
        flags += f" --rows {','.join(args.rows)} --batch {args.batch} --seq-len {args.seq_len}"
    if args.bf16:
        notes = ["", "Rows ending in -bf16 are hone with `precision=\"bf16\"` (bf16 compute, fp32 "
                 "master weights and optimizer state); their ratios (marked *) compare with "
                 "Tunix's and PyTorch's fp32 rows and do not count toward the goal."]
    _driver.report(args, _driver.section(
        args, "train.py", settings, bullets(vers), [
            "Median step time, tokens per second (B x T / step time) and how many times faster "
            "hone's step is:", "",
            speed_table(summary, impls, names), *notes, "",
            "First step (trace, compile and run) and peak resident memory:", "",
            cost_table(summary, impls, names), ""],
        goal_lines(summary, [r + tag for r in rows], impls), flags=flags), "train.py",
        [{"impl": i, "row": n, **s} for (i, n), s in summary.items()], flags)


if __name__ == "__main__":
    main()
