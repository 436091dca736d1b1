"""The backends' own fused attention behind model.attention=cudnn: cuDNN's flash attention through
`jax.nn.dot_product_attention`, for the masks it can express, with blockwise attention
(hone/models/blockwise.py) for the rest.

cuDNN takes a mask as flags, not vectors: causal, a key length per row (right padding) and a
local window. So it is used only when the spec says exactly that:
- statically: no segments, no branches, no soft-cap (cuDNN has none), as many queries as keys,
  half-precision inputs (cuDNN's flash attention has no float32), and a kernel that traces on
  this machine (a cuDNN that is present and new enough);
- at run time (a `lax.cond`, both branches compiled): the indices are the slots 0..T-1 and every
  row's valid keys are a non-empty prefix (no left padding, no empty row).
Anything else runs blockwise, with one warning when it is for a static reason.

A right-padding query past a sliding window sees no key. Dense (and blockwise) average all the
values there; cuDNN may give it anything. No loss reads a padding query, and its output reaches
only that query's own later layers, so that is the one place the paths may differ.
"""

from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from hone.models.blockwise import DEFAULT_BLOCK, blockwise_attention, filled_spec
from hone.models.masks import MaskSpec


def cudnn_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec | None, *,
                    scale: float, softcap: float | None = None, block: int = DEFAULT_BLOCK,
                    implementation: str = "cudnn") -> jax.Array:
    """q [B, T, N, H], k/v [B, S, K, H] -> [B, T, N, H] before the output projection, the
    numbers of `blockwise_attention`. implementation: "cudnn", or "xla" (the same call run by
    XLA: how the CPU tests check the mapping of the spec to cuDNN's arguments)."""
    b, t, _, _ = q.shape
    s = k.shape[1]
    spec = filled_spec(spec, b, t, s)
    window = spec.window

    def blocks(q, k, v):
        return blockwise_attention(q, k, v, spec, scale=scale, softcap=softcap,
                                   block_q=block, block_k=block)

    lengths = spec.k_valid.sum(1, dtype=jnp.int32)  # [B]

    def fused(q, k, v):
        return jax.nn.dot_product_attention(
            q, k, v, scale=scale, is_causal=True, key_value_seq_lengths=lengths,
            local_window_size=None if window is None else (window - 1, 0),
            implementation=implementation).astype(q.dtype)

    reason = _static_obstacle(q, k, v, spec, softcap, fused, implementation)
    if reason is not None:
        _warn_once(f"model.attention=cudnn: {reason}; using blockwise attention")
        return blocks(q, k, v)
    return jax.lax.cond(expressible(spec), fused, blocks, q, k, v)


def expressible(spec: MaskSpec) -> jax.Array:
    """Scalar bool: are the indices the slots 0..T-1 and every row's valid keys a non-empty
    prefix (causal attention with right padding only, which cuDNN's flags can say)?"""
    slots = jnp.arange(spec.q_index.shape[1], dtype=jnp.int32)
    lengths = spec.k_valid.sum(1, dtype=jnp.int32)  # [B]
    prefix = slots[None, :] < lengths[:, None]  # [B, S]
    return (jnp.all(spec.q_index == slots) & jnp.all(spec.k_index == slots)
            & jnp.all(spec.k_valid == prefix) & jnp.all(lengths > 0))


def _static_obstacle(q, k, v, spec: MaskSpec, softcap, fused, implementation) -> str | None:
    """Why cuDNN cannot run this call whatever the data, or None."""
    if spec.q_segment is not None or spec.q_branch is not None:
        return "packed segments and shared-prefix branches are not expressible"
    if softcap is not None:
        return "no logit soft-capping"
    if q.shape[1] != k.shape[1]:
        return "queries and keys differ in length"
    if implementation == "cudnn" and q.dtype not in (jnp.bfloat16, jnp.float16):
        return f"{q.dtype} inputs (cuDNN's flash attention takes bfloat16 or float16)"
    try:
        jax.eval_shape(fused, q, k, v)
    except Exception as err:  # cuDNN absent or too old, or a shape it does not take
        return f"not available here ({type(err).__name__}: {err})"
    return None


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=4)
