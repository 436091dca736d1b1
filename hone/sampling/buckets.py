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
