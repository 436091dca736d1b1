"""DPO step benchmark: hone vs Tunix vs PyTorch/transformers, side by side.

Row "DPO step, policy + frozen reference, 4 pairs of 64 + 64 tokens": SmolLM2-135M shape, random
init, fp32, full-parameter policy, reference = frozen copy of the initial weights, sigmoid DPO
beta 0.1, AdamW after global-norm clipping at 1.0; each of the 2B sequences is a 64-token prompt
(shared by its pair) + a 64-token completion, loss on the completion. Runs dpo_hone.py,
dpo_tunix.py (in the Tunix venv, created by _venvs.py if missing) and dpo_torch.py as separate
processes, one at a time, never in parallel, rotating the order every round; each times its
first step (compile) and the median of --repeats steps (see each script's docstring for exactly
what one step includes: Tunix's reference forward runs outside its jitted step, and is timed).
This driver takes the median over rounds per implementation, prints a markdown table with one
row per library and, with --write, rewrites the "## DPO step" section of benchmarks/RESULTS.md.

    .venv/bin/python benchmarks/dpo.py --write
    .venv/bin/python benchmarks/dpo.py --write --bf16   # also hone with bf16 compute
    .venv/bin/python benchmarks/dpo.py --rounds 1 --repeats 1   # smoke
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402

IMPLS = ("hone", "tunix", "torch")


def jobs(impl: str, args) -> list[tuple[str, list[str]]]:
    """One process; with --bf16, hone runs a second one with --precision bf16 (row dpo-bf16)."""
    cmd = _driver.command(
        impl, f"dpo_{impl}.py", "--repeats", args.repeats, "--pairs", args.pairs,
        "--prompt-len", args.prompt_len, "--completion-len", args.completion_len)
    out = [(f"{impl} dpo", cmd)]
    if impl == "hone" and args.bf16:
        out.append(("hone dpo-bf16", cmd + ["--precision", "bf16"]))
    return out


def bullets(vers: dict) -> dict[str, str]:
    return {
        "hone": "- hone: the jitted step `hone.train.build.compile_steps` builds with "
                "`hone.recipes.dpo.make_dpo_loss(cfg, \"copy\")` (what `hone dpo` runs), the "
                "reference copy passed as the step's aux, on the `smollm2-135m` preset; each "
                "pair is one row [prompt | chosen | rejected] with the prompt computed once "
                "(`dpo.shared_prompt`, the default; the other libraries run two rows per pair) "
                "and the LM head only where answer tokens are predicted; one call does both "
                "forwards, the loss, gradients and AdamW; timed until its metrics are ready; "
                f"jax {vers['jax']}, flax {vers['flax']}.",
        "tunix": "- tunix: `tunix.sft.dpo.dpo_trainer.DPOTrainer`: `_prepare_inputs` (which runs "
                 "the reference forward in its own nnx.jit call) + `shard_input` + the jitted "
                 "train step as `train()` builds it, timed until loss and grad norm are ready; "
                 "the loop's Python bookkeeping is not included; `tunix.models.llama3` Llama3; "
                 f"google-tunix {vers['tunix']}.",
        "torch": "- torch: transformers `LlamaForCausalLM` (sdpa, 2 threads), reference a "
                 "`deepcopy` under `torch.no_grad`, sigmoid DPO written out, `backward`, "
                 "`clip_grad_norm_`, `torch.optim.AdamW.step`, `zero_grad`, `loss.item()`; "
                 f"torch {vers['torch']}, transformers {vers['transformers']}.",
    }


def summarize(results: list[dict], impls) -> dict:
    """{(impl, row): medians over rounds (median_s, first_s), max peak_rss_mb, first_loss};
    rows "dpo" and, for hone with --bf16, "dpo-bf16"."""
    keys = [(i, "dpo") for i in impls] + [("hone", "dpo-bf16")]
    return _driver.aggregate(results, keys, lambda r: (r["impl"], r.get("row", "dpo")),
                             firsts=("first_loss",))


def table(summary: dict, pairs: int) -> str:
    """One markdown row per library (and hone bf16): medians over rounds, and how many times
    faster hone's fp32 step is."""
    hone = summary.get(("hone", "dpo"), {}).get("median_s")
    rows = [[impl if row == "dpo" else f"{impl} (bf16 compute)", f"{s['median_s']:.3f}",
             f"{pairs / s['median_s']:.2f}", f"{s['first_s']:.1f}", f"{s['peak_rss_mb']:.0f}",
             f"{s['first_loss']:.4f}",
             "-" if hone is None or row != "dpo" else f"{s['median_s'] / hone:.2f}x"]
            for (impl, row), s in summary.items()]
    return _driver.md_table(["library", "step s", "pairs/s", "first step s", "peak RSS MB",
                             "first loss", "hone speed-up"], rows)


def main():
    ap = _driver.parser(__doc__, IMPLS, "DPO step")
    ap.add_argument("--pairs", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--completion-len", type=int, default=64)
    ap.add_argument("--bf16", action="store_true",
                    help="also run hone with --precision bf16 (row dpo-bf16)")
    args = _driver.parse(ap, IMPLS)
    if args.bf16 and "hone" not in args.impls:
        ap.error("--bf16 runs hone: include hone in --impls")

    results = _driver.run_rounds(args, lambda impl: jobs(impl, args))
    summary = summarize(results, args.impls)
    p, c = args.prompt_len, args.completion_len
    settings = (
        f"DPO step, policy + frozen reference, {args.pairs} pairs of {p} + {c} tokens (2 x "
        f"{args.pairs} sequences of {p + c} random ids, a pair's two rows share the {p}-token "
        f"prompt, loss on the {c} completion tokens), sigmoid DPO beta 0.1, full-parameter "
        "policy, reference = frozen copy of the initial weights, AdamW (lr 1e-4, betas "
        "0.9/0.999, eps 1e-8, weight decay 0.01) after global-norm clipping at 1.0, fp32. Median "
        f"over {args.rounds} round(s) of each process's median of {args.repeats} timed step(s) "
        "after one first (compiling) step; one process per implementation, run one at a time, "
        "order rotated per round. First loss is log 2 = 0.6931 everywhere (policy = reference "
        "at step 0).")
    flags = " --bf16" if args.bf16 else ""  # the section and figures name the run exactly
    _driver.report(args, _driver.section(
        args, "dpo.py", settings, bullets(_driver.versions()), [
            table(summary, args.pairs), "",
            "hone speed-up: the library's median step time / hone's (fp32).", ""], flags=flags),
        "dpo.py", [{"impl": i, "row": row, **s} for (i, row), s in summary.items()], flags)


if __name__ == "__main__":
    main()
