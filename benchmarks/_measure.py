"""The measuring side every benchmark process shares: the options of each kind of script
(decode, train, DPO pairs, GRPO), the first-call-then-median timing, peak memory and the one JSON
line per measurement the drivers read.

Standard library only: the Tunix scripts run in their own virtual environment
(benchmarks/.venvs/tunix) and import this file from beside them, as the hone and PyTorch ones do.
The clock itself (`first_and_median`, `timed`, `peak_rss_mb`, `finite`) is hone/bench/timing.py,
also standard library only, loaded here by its path (not `import hone`, which the Tunix venv
lacks), so every implementation is timed by the same code as `hone bench`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
from pathlib import Path


def _load_timing():
    path = Path(__file__).resolve().parent.parent / "hone" / "bench" / "timing.py"
    spec = importlib.util.spec_from_file_location("_hone_bench_timing", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_timing = _load_timing()
finite, first_and_median = _timing.finite, _timing.first_and_median
timed, peak_rss_mb = _timing.timed, _timing.peak_rss_mb


def _ints(ap: argparse.ArgumentParser, **defaults: int) -> argparse.ArgumentParser:
    """Add one int option per keyword, in order (prompt_len=64 -> --prompt-len, default 64)."""
    for name, default in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return ap


def decode_args(description: str, precision: bool = False) -> argparse.Namespace:
    """Options of the decode scripts; args.batches becomes a list of ints."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batches", default="8,32")
    if precision:
        ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = _ints(ap, prompt_len=32, new_tokens=64, repeats=5, seed=0).parse_args()
    args.batches = [int(x) for x in args.batches.split(",")]
    return args


def train_args(description: str, precision: bool = False) -> argparse.Namespace:
    """Options of the training-step scripts; args.rows becomes a list of "sft"/"lora"."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rows", default="sft,lora")
    _ints(ap, repeats=5, batch=4, seq_len=128, seed=0)
    # train.remat's settings; torch maps every setting but "none" to gradient checkpointing
    ap.add_argument("--remat", default="none",
                    choices=("none", "full", "save_dots", "save_attention"))
    if precision:
        ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    for row in args.rows:
        if row not in ("sft", "lora"):
            ap.error(f"unknown row {row!r}; choose from sft, lora")
    return args


def pair_args(description: str, precision: bool = False) -> argparse.Namespace:
    """Options of the DPO scripts: --pairs pairs of --prompt-len + --completion-len tokens (and
    --precision where the script has a bf16 path)."""
    ap = argparse.ArgumentParser(description=description)
    _ints(ap, pairs=4, prompt_len=64, completion_len=64, repeats=5, seed=0)
    if precision:
        ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    return ap.parse_args()


def grpo_args(description: str) -> argparse.Namespace:
    """Options of the GRPO scripts: --prompts x --generations, --prompt-len + --new-tokens."""
    ap = _ints(argparse.ArgumentParser(description=description),
               prompts=2, generations=4, prompt_len=32, new_tokens=32)
    ap.add_argument("--beta", type=float, default=0.04)
    return _ints(ap, repeats=5, seed=0).parse_args()


def emit_decode(impl: str, batch: int, new_tokens: int, first: float, median: float) -> None:
    """One decode line; peak_rss_mb is the peak so far (batch sizes run in order, one process)."""
    print(json.dumps({"impl": impl, "batch": batch, "first_s": round(first, 4),
                      "median_s": round(median, 4),
                      "tokens_per_s": round(batch * new_tokens / median, 2),
                      "peak_rss_mb": round(peak_rss_mb(), 1)}), flush=True)


def emit_train(impl: str, row: str, tokens: int, first: float, median: float,
               first_loss: float) -> None:
    """One training-step line; `tokens` is what one step processes (B x T)."""
    print(json.dumps({"impl": impl, "row": row, "first_s": round(first, 4),
                      "median_s": round(median, 4),
                      "tokens_per_s": round(tokens / median, 2),
                      "peak_rss_mb": round(peak_rss_mb(), 1),
                      "first_loss": round(first_loss, 4)}), flush=True)


def emit_pairs(impl: str, args, first: float, median: float, first_loss: float,
               row: str = "dpo") -> None:
    """emit_train's line for a DPO step (row "dpo", or "dpo-bf16") over pair_args' 2B x
    (prompt + completion)."""
    tokens = 2 * args.pairs * (args.prompt_len + args.completion_len)
    emit_train(impl, row, tokens, first, median, first_loss)


def emit_grpo(impl: str, args, step_s: list, rollout_s: list, ref_s: list, update_s: list,
              first_loss, peak_mb: float | None = None, **extra) -> None:
    """One GRPO line from per-step seconds (the first step is first_s, the rest give medians; an
    empty list gives 0.0) over grpo_args' prompts x generations x (prompt + new tokens); peak_mb
    defaults to the peak so far; `extra` fields go last, as given."""
    first_loss = finite(first_loss)
    med = lambda xs: round(statistics.median(xs[1:]), 4) if xs else 0.0  # noqa: E731
    tokens = args.prompts * args.generations * (args.prompt_len + args.new_tokens)
    print(json.dumps({
        "impl": impl, "row": "grpo", "first_s": round(step_s[0], 4), "median_s": med(step_s),
        "tokens_per_s": round(tokens / statistics.median(step_s[1:]), 2),
        "peak_rss_mb": round(peak_rss_mb() if peak_mb is None else peak_mb, 1),
        "first_loss": round(first_loss, 4), "rollout_s": med(rollout_s), "ref_s": med(ref_s),
        "update_s": med(update_s), **extra}), flush=True)
