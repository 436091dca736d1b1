"""Replica consistency: every copy of a replicated array holds the same bits.

After a restore on several devices each replica was read from disk on its own (and, across
hosts, by another process), so a bad read or a bug in placing would leave devices training
different weights without any error. The loop checks this once after every restore: shards
with the same index into the same array must be bit-identical. Each process checks the
replicas on its own devices, one shard at a time (memory: two shards)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np


def replica_mismatches(tree: Any) -> list[str]:
    """Paths of the arrays in `tree` whose replicas on this process's devices differ."""
    bad = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        shards = getattr(x, "addressable_shards", None)
        if not shards or len(shards) < 2:
            continue
        first: dict[Any, np.ndarray] = {}
        for shard in shards:
            key = tuple((s.start, s.stop, s.step) for s in shard.index)
            data = np.ascontiguousarray(shard.data).reshape(-1).view(np.uint8)  # bits
            if key not in first:
                first[key] = data
            elif not np.array_equal(first[key], data):
                bad.append(jax.tree_util.keystr(path))
                break
    return bad


def count_replicated(tree: Any) -> int:
    """Arrays with at least two copies on this process's devices."""
    count = 0
    for x in jax.tree.leaves(tree):
        shards = getattr(x, "addressable_shards", None) or []
        count += len({tuple((s.start, s.stop) for s in sh.index) for sh in shards}) < len(shards)
    return count
