"""The measuring side every benchmark process shares: arguments, the first-call-then-median
timing, peak memory and the one JSON line per measurement the drivers read.

Standard library only: the Tunix scripts run in their own virtual environment
(benchmarks/.venvs/tunix) and import this file from beside them, as the hone and PyTorch ones do.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
from typing import Callable


def decode_args(description: str) -> argparse.Namespace:
    """Options of the decode scripts; args.batches becomes a list of ints."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--batches", default="8,32")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    args.batches = [int(x) for x in args.batches.split(",")]
    return args


def train_args(description: str, precision: bool = False) -> argparse.Namespace:
    """Options of the training-step scripts; args.rows becomes a list of "sft"/"lora"."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--rows", default="sft,lora")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    if precision:
        ap.add_argument("--precision", default="fp32", choices=("fp32", "bf16"))
    args = ap.parse_args()
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    for row in args.rows:
        if row not in ("sft", "lora"):
            ap.error(f"unknown row {row!r}; choose from sft, lora")
    return args


def first_and_median(run: Callable[[], tuple[float, object]], repeats: int):
    """(first call's seconds, median seconds of `repeats` more calls, first call's value);
    run() returns (seconds, value)."""
    first, value = run()
    times = [run()[0] for _ in range(max(1, repeats))]
    return first, statistics.median(times), value


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def emit_decode(impl: str, batch: int, new_tokens: int, first: float, median: float) -> None:
    print(json.dumps({"impl": impl, "batch": batch, "first_s": round(first, 4),
                      "median_s": round(median, 4),
                      "tokens_per_s": round(batch * new_tokens / median, 2)}), flush=True)


def emit_train(impl: str, row: str, args, first: float, median: float, first_loss: float) -> None:
    print(json.dumps({"impl": impl, "row": row, "first_s": round(first, 4),
                      "median_s": round(median, 4),
                      "tokens_per_s": round(args.batch * args.seq_len / median, 2),
                      "peak_rss_mb": round(peak_rss_mb(), 1),
                      "first_loss": round(first_loss, 4)}), flush=True)
