"""The measuring side every benchmark process shares: the options of each kind of script
(decode, train, DPO pairs, GRPO), the first-call-then-median timing, peak memory and the one JSON
line per measurement the drivers read.

Standard library only: the Tunix scripts run in their own virtual environment
(benchmarks/.venvs/tunix) and import this file from beside them, as the hone and PyTorch ones do.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import statistics
import time
from typing import Callable


def _ints(ap: argparse.ArgumentParser, **defaults: int) -> argparse.ArgumentParser:
    """Add one int option per keyword, in order (prompt_len=64 -> --prompt-len, default 64)."""
    for name, default in defaults.items():
        ap.add_argument("--" + name.replace("_", "-"), type=int, default=default)
    return ap


def decode_args(description: str) -> argparse.Namespace:
    """Options of the decode scripts; args.batches becomes a list of ints."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batches", default="8,32")
    args = _ints(ap, prompt_len=32, new_tokens=64, repeats=5, seed=0).parse_args()
    args.batches = [int(x) for x in args.batches.split(",")]
    return args


def train_args(description: str, precision: bool = False) -> argparse.Namespace:
    """Options of the training-step scripts; args.rows becomes a list of "sft"/"lora"."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rows", default="sft,lora")
    _ints(ap, repeats=5, batch=4, seq_len=128, seed=0)
    if precision:
        ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    for row in args.rows:
        if row not in ("sft", "lora"):
            ap.error(f"unknown row {row!r}; choose from sft, lora")
    return args


def pair_args(description: str) -> argparse.Namespace:
    """Options of the DPO scripts: --pairs pairs of --prompt-len + --completion-len tokens."""
    ap = argparse.ArgumentParser(description=description)
    return _ints(ap, pairs=4, prompt_len=64, completion_len=64, repeats=5, seed=0).parse_args()


def grpo_args(description: str) -> argparse.Namespace:
    """Options of the GRPO scripts: --prompts x --generations, --prompt-len + --new-tokens."""
    ap = _ints(argparse.ArgumentParser(description=description),
               prompts=2, generations=4, prompt_len=32, new_tokens=32)
    ap.add_argument("--beta", type=float, default=0.04)
    return _ints(ap, repeats=5, seed=0).parse_args()


def finite(x) -> float:
    """float(x), asserting it is finite (a loss that became inf or nan fails the run)."""
    x = float(x)
    assert math.isfinite(x), x
    return x


def first_and_median(call: Callable[[], object], repeats: int,
                     wait: Callable[[object], object] | None = None,
                     value: Callable[[object], object] | None = None):
    """(first call's seconds, median seconds of `repeats` more calls, value(first call's out)).

    Each call is timed from before call() until it returns, or until wait(out) returns when given
    (e.g. jax.block_until_ready); value(out) runs after the clock stops, on every call, so checks
    there are not timed. Without value, the third item is None."""
    def run():
        t0 = time.perf_counter()
        out = call()
        if wait is not None:
            wait(out)
        dt = time.perf_counter() - t0
        return dt, (None if value is None else value(out))

    first, got = run()
    times = [run()[0] for _ in range(max(1, repeats))]
    return first, statistics.median(times), got


def timed(record: list, fn: Callable, wait: Callable[[object], object] | None = None):
    """fn, appending each call's wall-clock seconds (until wait(out) returns, if given) to
    `record`: for timing calls made inside a library's own loop."""
    def wrapper(*a, **kw):
        t0 = time.perf_counter()
        out = fn(*a, **kw)
        if wait is not None:
            wait(out)
        record.append(time.perf_counter() - t0)
        return out
    return wrapper


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def emit_decode(impl: str, batch: int, new_tokens: int, first: float, median: float) -> None:
    print(json.dumps({"impl": impl, "batch": batch, "first_s": round(first, 4),
                      "median_s": round(median, 4),
                      "tokens_per_s": round(batch * new_tokens / median, 2)}), flush=True)


def emit_train(impl: str, row: str, tokens: int, first: float, median: float,
               first_loss: float) -> None:
    """One training-step line; `tokens` is what one step processes (B x T)."""
    print(json.dumps({"impl": impl, "row": row, "first_s": round(first, 4),
                      "median_s": round(median, 4),
                      "tokens_per_s": round(tokens / median, 2),
                      "peak_rss_mb": round(peak_rss_mb(), 1),
                      "first_loss": round(first_loss, 4)}), flush=True)


def emit_pairs(impl: str, args, first: float, median: float, first_loss: float) -> None:
    """emit_train's line for a DPO step (row "dpo") over pair_args' 2B x (prompt + completion)."""
    tokens = 2 * args.pairs * (args.prompt_len + args.completion_len)
    emit_train(impl, "dpo", tokens, first, median, first_loss)


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
