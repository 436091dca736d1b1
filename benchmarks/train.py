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

import argparse
import datetime
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402
import _venvs  # noqa: E402

RESULTS = _driver.RESULTS
TITLE = "Training steps"
IMPLS = ("hone", "tunix", "torch")
ROWS = ("sft", "lora")
BUSY: list[float] = []  # cores busy with other work, sampled before each process
GOALS = {"tunix": 2.0, "torch": 2.5}  # hone's step at least this many times faster


def run_one(impl: str, row: str, args, precision: str = "fp32") -> list[dict]:
    cmd = [_driver.python_for(impl), str(HERE / f"train_{impl}.py"), "--rows", row,
           "--repeats", str(args.repeats), "--batch", str(args.batch),
           "--seq-len", str(args.seq_len)]
    if precision != "fp32":
        cmd += ["--precision", precision]
    return _driver.run_json(impl, cmd, timeout=args.timeout, busy=BUSY)


def bullets(vers: dict) -> list[tuple[str, str]]:
    return [
        ("hone", "- hone: the jitted step of `hone.train.step.make_train_step` with "
                 "`hone.recipes.sft.sft_step_loss` (what `hone sft` runs), on "
                 "`hone.load_model(\"smollm2-135m\")`, LoRA by `hone.models.lora.apply_lora`; "
                 "timed: `step(state, frozen, batch)` until its metrics are ready; "
                 f"jax {vers['jax']}, flax {vers['flax']}."),
        ("tunix", "- tunix: `tunix.sft.peft_trainer.PeftTrainer`'s jitted train step (as "
                  "`train()` builds it, called on the prepared batch; timed until loss and grad "
                  "norm are ready; the loop's Python bookkeeping and dispatch overlap are not "
                  "included) on `tunix.models.llama3` Llama3, LoRA by qwix "
                  f"`apply_lora_to_model`; google-tunix {vers['tunix']}."),
        ("torch", "- torch: transformers `LlamaForCausalLM` (sdpa, 2 threads): forward with "
                  "labels, `backward`, `clip_grad_norm_`, `torch.optim.AdamW.step`, `zero_grad`,"
                  " `loss.item()`; LoRA by peft `get_peft_model`; torch "
                  f"{vers['torch']}, transformers {vers['transformers']}, peft {vers['peft']}."),
    ]


def summarize(rows: list[dict], impls, names, tokens: int) -> dict:
    summary = {}
    for impl in impls:
        for name in names:
            mine = [r for r in rows if r["impl"] == impl and r["row"] == name]
            if not mine:
                continue
            med = statistics.median(r["median_s"] for r in mine)
            summary[impl, name] = {
                "median_s": med, "tokens_per_s": tokens / med,
                "first_s": statistics.median(r["first_s"] for r in mine),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in mine), "runs": len(mine)}
    return summary


def base_row(name: str) -> str:
    return name.split("-")[0]  # "sft-bf16" is compared with the others' fp32 "sft"


def ratio(summary, name, other):
    """How many times faster hone's step is than `other`'s (their median / hone's median)."""
    if ("hone", name) in summary and (other, base_row(name)) in summary:
        return summary[other, base_row(name)]["median_s"] / summary["hone", name]["median_s"]
    return None


def speed_table(summary, impls, names) -> str:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    get = lambda i, n, k: summary[i, n][k] if (i, n) in summary else None  # noqa: E731
    head = (["row"] + [f"{i} step s" for i in impls] + [f"{i} tok/s" for i in impls]
            + ["hone/tunix", "hone/torch"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in names:
        cells = [n]
        cells += [fmt(get(i, n, "median_s"), ".3f") for i in impls]
        cells += [fmt(get(i, n, "tokens_per_s"), ".1f") for i in impls]
        for other in ("tunix", "torch"):
            r = ratio(summary, n, other)
            mark = "*" if n != base_row(n) else ""
            cells.append("-" if r is None else f"{r:.2f}x{mark}")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def cost_table(summary, impls, names) -> str:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    get = lambda i, n, k: summary[i, n][k] if (i, n) in summary else None  # noqa: E731
    head = (["row"] + [f"{i} first step s" for i in impls]
            + [f"{i} peak RSS MB" for i in impls])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for n in names:
        cells = [n]
        cells += [fmt(get(i, n, "first_s"), ".1f") for i in impls]
        cells += [fmt(get(i, n, "peak_rss_mb"), ".0f") for i in impls]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--bf16", action="store_true",
                    help="also run hone with --precision bf16 (rows sft-bf16, lora-bf16)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    ap.add_argument("--write", action="store_true", help=f"rewrite '## {TITLE}' in {RESULTS.name}")
    args = ap.parse_args()
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        ap.error(f"unknown impls {sorted(unknown)}; choose from {IMPLS}")
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = set(rows) - set(ROWS)
    if unknown:
        ap.error(f"unknown rows {sorted(unknown)}; choose from {ROWS}")
    if args.bf16 and "hone" not in impls:
        ap.error("--bf16 runs hone: include hone in --impls")

    if "tunix" in impls:
        _venvs.tunix_python()  # create the venv before any timing starts
    results = []
    for rnd in range(args.rounds):
        order = impls[rnd % len(impls):] + impls[:rnd % len(impls)]
        for impl in order:
            for row in rows:
                print(f"round {rnd + 1}/{args.rounds}: {impl} {row}", flush=True)
                results += run_one(impl, row, args)
                if impl == "hone" and args.bf16:
                    print(f"round {rnd + 1}/{args.rounds}: hone {row}-bf16", flush=True)
                    results += run_one(impl, row, args, precision="bf16")

    names = rows + ([f"{r}-bf16" for r in rows] if args.bf16 else [])
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
    notes = []
    if args.bf16:
        notes = ["", "Rows ending in -bf16 are hone with `precision=\"bf16\"` (bf16 compute, fp32 "
                 "master weights and optimizer state); their ratios (marked *) compare with "
                 "Tunix's and PyTorch's fp32 rows and do not count toward the goal."]
    section = "\n".join([
        f"## {TITLE}", "",
        f"Measured {datetime.date.today().isoformat()} with `benchmarks/train.py "
        f"--rounds {args.rounds} --repeats {args.repeats}{' --bf16' if args.bf16 else ''}`: "
        f"{settings}", "",
        *[line for impl, line in bullets(vers) if impl in impls], "",
        "Median step time, tokens per second (B x T / step time) and how many times faster "
        "hone's step is:", "",
        speed_table(summary, impls, names), *notes, "",
        "First step (trace, compile and run) and peak resident memory:", "",
        cost_table(summary, impls, names), "",
        _driver.busy_line(BUSY), "",
        *goal_lines(summary, rows, impls), ""])
    print()
    print(section)
    if args.write:
        _driver.write_section(TITLE, section)
        print(f"wrote the {TITLE} section of {RESULTS}")


if __name__ == "__main__":
    main()
