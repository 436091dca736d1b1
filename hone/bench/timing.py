"""Timing and memory helpers of every benchmark: the first-call-then-median clock, a timer for
calls made inside a library's own loop, peak resident memory, a finite-loss check.

Standard library only, on purpose: benchmarks/_measure.py loads this file by its path so that
the Tunix scripts (their own virtual environment, without hone) time with the same code.
"""

from __future__ import annotations

import math
import resource
import statistics
import time
from typing import Callable


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
    there are not timed. Without value, the third item is None. repeats 0 times the first call
    only (the median is then nan): a long row's first step can take minutes."""
    def run():
        t0 = time.perf_counter()
        out = call()
        if wait is not None:
            wait(out)
        dt = time.perf_counter() - t0
        return dt, (None if value is None else value(out))

    first, got = run()
    times = [run()[0] for _ in range(repeats)]
    return first, statistics.median(times) if times else math.nan, got


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
    """The process's peak resident set so far, in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB
