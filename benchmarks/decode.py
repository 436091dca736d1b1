"""Greedy-decode benchmark: hone vs Tunix vs PyTorch/transformers, side by side.

Runs decode_hone.py, decode_tunix.py (in the Tunix venv, created by _venvs.py if missing) and
decode_torch.py as separate processes, one after another and never in parallel, rotating the
order every round. Each process times the first call (compile) and the median of --repeats calls
per batch size; this driver takes the median over rounds per (impl, batch), prints a markdown
table with the ratios hone/tunix and hone/torch, and with --write rewrites the "## Decode"
section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/decode.py --write
    .venv/bin/python benchmarks/decode.py --impls hone,tunix   # without hone-bf16 and torch
    .venv/bin/python benchmarks/decode.py --rounds 1 --repeats 1 --batches 2 --new-tokens 8  # smoke
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402

IMPLS = ("hone", "hone-bf16", "tunix", "torch")
GOAL = 2.0  # hone's greedy decode at least 2x Tunix's tokens per second


def jobs(impl: str, args) -> list[tuple[str, list[str]]]:
    """One process per implementation; hone-bf16 is decode_hone.py with bfloat16 weights."""
    script = "hone" if impl == "hone-bf16" else impl
    cmd = _driver.command(
        impl, f"decode_{script}.py", "--batches", args.batches, "--prompt-len", args.prompt_len,
        "--new-tokens", args.new_tokens, "--repeats", args.repeats)
    return [(impl, cmd + (["--precision", "bf16"] if impl == "hone-bf16" else []))]


def bullets(vers: dict) -> dict[str, str]:
    return {
        "hone": "- hone: `hone.generate(model, None, ids, temperature=0.0, eos_ids=())` on "
                f"`hone.load_model(\"smollm2-135m\")`; jax {vers['jax']}, flax {vers['flax']}. "
                "hone-bf16: the same with bfloat16 weights "
                "(`dtype=\"bfloat16\"`; float32 accumulation, float32 logits).",
        "tunix": "- tunix: `tunix.generate.sampler.Sampler` (greedy) on `tunix.models.llama3` "
                 f"Llama3; google-tunix {vers['tunix']}.",
        "torch": "- torch: transformers `LlamaForCausalLM.generate` (sdpa, 2 threads); torch "
                 f"{vers['torch']}, transformers {vers['transformers']}.",
    }


def summarize(rows: list[dict], impls, batches, new_tokens) -> dict:
    summary = _driver.aggregate(rows, [(i, b) for i in impls for b in batches],
                                lambda r: (r["impl"], r["batch"]))
    for (_, b), s in summary.items():
        s["tokens_per_s"] = b * new_tokens / s["median_s"]
    return summary


def ratio(summary, b, a, c):
    if (a, b) in summary and (c, b) in summary:
        return summary[a, b]["tokens_per_s"] / summary[c, b]["tokens_per_s"]
    return None


def table(summary, impls, batches) -> str:
    head = (["batch"] + [f"{i} tok/s" for i in impls] + ["hone/tunix", "hone/torch"]
            + [f"{i} median s" for i in impls] + [f"{i} first call s" for i in impls])
    rows = []
    for b in batches:
        cells = [str(b)]
        cells += [_driver.cell(summary, (i, b), "tokens_per_s", ".1f") for i in impls]
        for other in ("tunix", "torch"):
            r = ratio(summary, b, "hone", other)
            cells.append("-" if r is None else f"{r:.2f}x")
        cells += [_driver.cell(summary, (i, b), "median_s", ".3f") for i in impls]
        cells += [_driver.cell(summary, (i, b), "first_s", ".1f") for i in impls]
        rows.append(cells)
    return _driver.md_table(head, rows)


def goal_lines(summary, batches) -> list[str]:
    out = [f"Goal: hone's greedy decode reaches at least {GOAL:g}x Tunix's tokens per second "
           "(every batch size)."]
    for b in batches:
        r = ratio(summary, b, "hone", "tunix")
        if r is None:
            out.append(f"- batch {b}: not measured")
        else:
            out.append(f"- batch {b}: {r:.2f}x Tunix: {'met' if r >= GOAL else 'NOT met'}")
    return out


def main():
    ap = _driver.parser(__doc__, IMPLS, "Decode")
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    args = _driver.parse(ap, IMPLS)
    batches = [int(x) for x in args.batches.split(",")]

    rows = _driver.run_rounds(args, lambda impl: jobs(impl, args))
    impls = args.impls
    summary = summarize(rows, impls, batches, args.new_tokens)
    # hone-bf16 is saved as hone's row "decode-B-bf16" (the summary compares it with the
    # others' fp32 "decode-B").
    records = []
    for (impl, b), s in summary.items():
        bf16 = impl == "hone-bf16"
        records.append({"impl": "hone" if bf16 else impl,
                        "row": f"decode-{b}-bf16" if bf16 else f"decode-{b}", "batch": b, **s})
    settings = (f"greedy decode of {args.new_tokens} new tokens from {args.prompt_len}-token "
                f"random prompts (all one length, no EOS), fp32; median over {args.rounds} "
                f"round(s) of each process's median of {args.repeats} timed call(s) after one "
                "first (compiling) call; processes run one at a time, order rotated per round.")
    _driver.report(args, _driver.section(
        args, "decode.py", settings, bullets(_driver.versions()),
        [table(summary, impls, batches), ""], goal_lines(summary, batches)),
        "decode.py", records)


if __name__ == "__main__":
    main()
