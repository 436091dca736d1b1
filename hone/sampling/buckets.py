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
    """The decode batch for n running sequences: the next power of two from 8, at most `cap`
    (the engine's max_seqs): a long tail of finishing sequences decodes a small batch, from a
    handful of programs (8, 16, 32, 64 rows for 64 sequences)."""
    return max(1, min(bucket(n, minimum=8), cap))


def row_buckets(cap: int) -> list[int]:
    """Every decode batch `row_bucket` gives for up to `cap` sequences."""
    return sorted({row_bucket(n, cap) for n in (1, *(2 ** k for k in range(3, 31)), cap)
                   if n <= cap})


def block_bucket(n: int, cap: int) -> int:
    """The prefill blocks of a call for n blocks of work: the next power of two, at most `cap`
    (the engine's blocks a call)."""
    return min(bucket(n, minimum=1), cap)


def block_buckets(cap: int) -> list[int]:
    """Every prefill call's blocks `block_bucket` gives up to `cap`."""
    return sorted({block_bucket(n, cap) for n in (*(2 ** k for k in range(31)), cap)
                   if n <= cap})
