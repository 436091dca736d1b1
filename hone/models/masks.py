"""Which keys a query may see: the per-token vectors that say it (`MaskSpec`) and the boolean
[B, T, S] array built from them (`make_mask`).

A spec is O(T + S); the built mask is O(T x S). The transformer hands every layer a spec, so the
dense path builds its mask where it needs it and the blockwise path (hone/models/blockwise.py)
calls make_mask on one block of queries and one of keys at a time ([B, block_q, block_k]) and
never on the whole. Both read the same rule, so they can only disagree in arithmetic, never in
which keys are seen.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

# The score a masked key gets: a finite "minus infinity", so a row with every key masked (a
# padding query) becomes uniform instead of NaN; its output is ignored by the losses anyway.
MASKED = float(jnp.finfo(jnp.float32).min)


def make_mask(q_index: jax.Array, k_index: jax.Array, k_valid: jax.Array,
              window: int | None, q_segment: jax.Array | None = None,
              k_segment: jax.Array | None = None, q_branch: jax.Array | None = None,
              k_branch: jax.Array | None = None, *, q_bidirectional: jax.Array | None = None,
              k_bidirectional: jax.Array | None = None) -> jax.Array:
    """Boolean [B, T, S]: may query t see key s? (T and S: whole rows, or one block of each.)

    q_index [B, T] / k_index [B, S]: slot of each token in the (cached) sequence, which orders
    causality and measures window distance; k_valid [B, S]: key is a real token (not padding,
    already written to the cache). With segments (packed documents) only equal segments see
    each other. With branches (several continuations of one shared prefix in a row) a key of
    branch 0 (the prefix) is seen by every branch, any other key only by its own branch.
    With bidirectional blocks (Gemma 3's image tokens) a query of block b >= 1 also sees the
    later keys of its own block: causality is relaxed inside a block (0: no block), and the
    window, padding, segments and branches then apply as to any key (transformers'
    AND(window, OR(causal, block)); the window only bounds the past, so a whole block is seen).
    """
    diff = q_index[:, :, None] - k_index[:, None, :]  # [B, T, S]
    seen = diff >= 0
    if q_bidirectional is not None:
        seen |= ((q_bidirectional[:, :, None] == k_bidirectional[:, None, :])
                 & (q_bidirectional[:, :, None] > 0))
    mask = seen & k_valid[:, None, :]
    if window is not None:
        mask &= diff < window
    if q_segment is not None:
        mask &= q_segment[:, :, None] == k_segment[:, None, :]
    if q_branch is not None:
        mask &= (k_branch[:, None, :] == 0) | (q_branch[:, :, None] == k_branch[:, None, :])
    return mask


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class MaskSpec:
    """The vectors make_mask reads, unbuilt: queries [B, T] and keys [B, S] may differ in length
    (a prefill chunk against a cache). window is static (part of the tree's structure); the
    optional pairs are both given or both None."""

    q_index: jax.Array  # [B, T] int32
    k_index: jax.Array  # [B, S] int32
    k_valid: jax.Array  # [B, S] bool
    window: int | None = dataclasses.field(default=None, metadata={"static": True})
    q_segment: jax.Array | None = None  # [B, T]
    k_segment: jax.Array | None = None  # [B, S]
    q_branch: jax.Array | None = None  # [B, T]
    k_branch: jax.Array | None = None  # [B, S]
    q_bidirectional: jax.Array | None = None  # [B, T] int: 0, or the bidirectional block
    k_bidirectional: jax.Array | None = None  # [B, S]

    def build(self) -> jax.Array:
        """The whole boolean mask [B, T, S] (the dense path)."""
        return make_mask(self.q_index, self.k_index, self.k_valid, self.window,
                         self.q_segment, self.k_segment, self.q_branch, self.k_branch,
                         q_bidirectional=self.q_bidirectional,
                         k_bidirectional=self.k_bidirectional)
