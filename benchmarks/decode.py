"""Greedy-decode benchmark: hone vs Tunix vs PyTorch/transformers, side by side.

Runs decode_hone.py, decode_tunix.py (in the Tunix venv, created by _venvs.py if missing) and
decode_torch.py as separate processes, one after another and never in parallel, rotating the
order every round. Each process times the first call (compile) and the median of --repeats calls
per batch size; this driver takes the median over rounds per (impl, batch), prints a markdown
table with the ratios hone/tunix and hone/torch, and with --write rewrites the "## Decode"
section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/decode.py --write
    .venv/bin/python benchmarks/decode.py --rounds 1 --repeats 1 --batches 2 --new-tokens 8  # smoke
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
IMPLS = ("hone", "tunix", "torch")
BUSY: list[float] = []  # cores busy with other work, sampled before each process
GOAL = 2.0  # hone's greedy decode at least 2x Tunix's tokens per second


def run_one(impl: str, args) -> list[dict]:
    cmd = [_driver.python_for(impl), str(HERE / f"decode_{impl}.py"), "--batches", args.batches,
           "--prompt-len", str(args.prompt_len), "--new-tokens", str(args.new_tokens),
           "--repeats", str(args.repeats)]
    return _driver.run_json(impl, cmd, timeout=args.timeout, busy=BUSY)


def bullets(vers: dict) -> list[tuple[str, str]]:
    return [
        ("hone", "- hone: `hone.generate(model, None, ids, temperature=0.0, eos_ids=())` on "
                 f"`hone.load_model(\"smollm2-135m\")`; jax {vers['jax']}, flax {vers['flax']}."),
        ("tunix", "- tunix: `tunix.generate.sampler.Sampler` (greedy) on `tunix.models.llama3` "
                  f"Llama3; google-tunix {vers['tunix']}."),
        ("torch", "- torch: transformers `LlamaForCausalLM.generate` (sdpa, 2 threads); torch "
                  f"{vers['torch']}, transformers {vers['transformers']}."),
    ]


def summarize(rows: list[dict], impls, batches, new_tokens) -> dict:
    summary = {}
    for impl in impls:
        for b in batches:
            mine = [r for r in rows if r["impl"] == impl and r["batch"] == b]
            if not mine:
                continue
            med = statistics.median(r["median_s"] for r in mine)
            summary[impl, b] = {"median_s": med, "first_s": statistics.median(
                r["first_s"] for r in mine), "tokens_per_s": b * new_tokens / med,
                "runs": len(mine)}
    return summary


def ratio(summary, b, a, c):
    if (a, b) in summary and (c, b) in summary:
        return summary[a, b]["tokens_per_s"] / summary[c, b]["tokens_per_s"]
    return None


def table(summary, impls, batches) -> str:
    fmt = lambda x, spec: "-" if x is None else format(x, spec)  # noqa: E731
    get = lambda i, b, k: summary[i, b][k] if (i, b) in summary else None  # noqa: E731
    head = (["batch"] + [f"{i} tok/s" for i in impls] + ["hone/tunix", "hone/torch"]
            + [f"{i} median s" for i in impls] + [f"{i} first call s" for i in impls])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for b in batches:
        cells = [str(b)]
        cells += [fmt(get(i, b, "tokens_per_s"), ".1f") for i in impls]
        for other in ("tunix", "torch"):
            r = ratio(summary, b, "hone", other)
            cells.append("-" if r is None else f"{r:.2f}x")
        cells += [fmt(get(i, b, "median_s"), ".3f") for i in impls]
        cells += [fmt(get(i, b, "first_s"), ".1f") for i in impls]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


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
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    ap.add_argument("--write", action="store_true", help=f"rewrite '## Decode' in {RESULTS.name}")
    args = ap.parse_args()
    impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        ap.error(f"unknown impls {sorted(unknown)}; choose from {IMPLS}")
    batches = [int(x) for x in args.batches.split(",")]

    if "tunix" in impls:
        _venvs.tunix_python()  # create the venv before any timing starts
    rows = []
    for rnd in range(args.rounds):
        order = impls[rnd % len(impls):] + impls[:rnd % len(impls)]
        for impl in order:
            print(f"round {rnd + 1}/{args.rounds}: {impl}", flush=True)
            rows += run_one(impl, args)

    summary = summarize(rows, impls, batches, args.new_tokens)
    vers = _driver.versions()
    settings = (f"greedy decode of {args.new_tokens} new tokens from {args.prompt_len}-token "
                f"random prompts (all one length, no EOS), fp32; median over {args.rounds} "
                f"round(s) of each process's median of {args.repeats} timed call(s) after one "
                "first (compiling) call; processes run one at a time, order rotated per round.")
    section = "\n".join([
        "## Decode", "",
        f"Measured {datetime.date.today().isoformat()} with `benchmarks/decode.py "
        f"--rounds {args.rounds} --repeats {args.repeats}`: {settings}", "",
        *[line for impl, line in bullets(vers) if impl in impls], "",
        table(summary, impls, batches), "",
        _driver.busy_line(BUSY),
        "",
        *goal_lines(summary, batches), ""])
    print()
    print(section)
    if args.write:
        _driver.write_section("Decode", section)
        print(f"wrote the Decode section of {RESULTS}")


if __name__ == "__main__":
    main()
