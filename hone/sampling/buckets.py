"""Shape buckets: the sizes the samplers pad to, so varied requests compile a handful of programs.

Powers of two from a minimum: a batch of 5 rows runs as 8, a prompt of 40 tokens as 64. Each
jitted program is then reused for every request that falls in its bucket.
"""

from __future__ import annotations


def bucket(n: int, minimum: int = 16) -> int:
    """The next power of two >= n (at least `minimum`)."""
    size = minimum
    while size < n:
        size *= 2
    return size


def row_bucket(n: int, cap: int) -> int:
    """The decode batch for n running sequences: 16, 32, 48, 64, 96, 128, 192, 256, ... (each
    at most 1.5x the one before from 32 on), at most `cap` (the engine's max_seqs): a long tail
    of finishing sequences decodes a small batch, from a handful of programs (16, 32, 48, 64
    rows for 64 sequences). None below 16: on a CPU a step of fewer rows costs about the same
    (it reads every weight once), and on an accelerator far more so."""
    size = 16
    while size < n:
        size = size * 3 // 2 if size & (size - 1) == 0 and size >= 32 else (
            size * 2 if size < 32 else size * 4 // 3)
    return max(1, min(size, cap))


def row_buckets(cap: int) -> list[int]:
    """Every decode batch `row_bucket` gives for up to `cap` sequences."""
    sizes, n = {row_bucket(cap, cap)}, 1
    while n < cap:
        sizes.add(row_bucket(n, cap))
        n = row_bucket(n, cap) + 1
    return sorted(sizes)


def block_bucket(n: int, cap: int) -> int:
    """The prefill blocks of a call for n blocks of work: the next power of two, at most `cap`
    (the engine's blocks a call)."""
    return min(bucket(n, minimum=1), cap)


def block_buckets(cap: int) -> list[int]:
    """Every prefill call's blocks `block_bucket` gives up to `cap`."""
    return sorted({block_bucket(n, cap) for n in (*(2 ** k for k in range(31)), cap)
                   if n <= cap})
