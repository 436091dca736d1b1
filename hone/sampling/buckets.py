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
    """The decode batch for n running sequences: 8, 16, 32, 48, 64, then the next multiple of 32,
    at most `cap` (the engine's max_seqs). A long tail of finishing sequences shrinks the batch
    in steps of at most a third above 32 rows (below, a step costs about the same whatever its
    rows: it reads every weight once), from a handful of programs."""
    size = next((s for s in (8, 16, 32, 48, 64) if s >= n), -(-n // 32) * 32)
    return max(1, min(size, cap))


def chunk_bucket(n: int) -> int:
    """The width of a prefill chunk of n tokens: a multiple of 8 up to 64, then a power of two.
    A turn's appended tokens (a tool result and the next header: often 10-30 tokens) are
    prefilled at close to their length, not doubled; prefill costs what its padded tokens do."""
    return -(-max(n, 1) // 8) * 8 if n <= 64 else bucket(n)
