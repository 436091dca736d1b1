"""hone/bench/timing.py's clock: how many calls `first_and_median` makes and what it returns."""

from __future__ import annotations

import math

from hone.bench.timing import first_and_median


def test_repeats_count_the_calls_after_the_first_and_zero_times_the_first_only():
    calls = []

    def call():
        calls.append(len(calls))
        return len(calls)

    first, med, got = first_and_median(call, 2, value=lambda out: out * 10)
    assert len(calls) == 3 and got == 10  # value of the first call's output
    assert first >= 0 and med >= 0
    calls.clear()
    first, med, got = first_and_median(call, 0)
    assert len(calls) == 1 and math.isnan(med) and got is None  # a long row's first step only
