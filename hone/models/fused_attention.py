"""The backends' own fused attention kernels behind model.attention=cudnn and =splash, for the
masks they can express, with blockwise attention (hone/models/blockwise.py) for the rest.

cuDNN (`jax.nn.dot_product_attention`) takes a mask as flags: causal, a key length per row (right
padding) and a local window. It is used only when the spec says exactly that:
- statically: no segments, no branches, no bidirectional blocks, no soft-cap (cuDNN has
  none), as many queries as keys, half-precision inputs (cuDNN's flash attention has no
  float32), and a kernel that traces on this machine (a cuDNN that is present and new enough);
- at run time (a `lax.cond`, both branches compiled): the indices are the slots 0..T-1 and every
  row's valid keys are a non-empty prefix (no left padding, no empty row).
A right-padding query past a sliding window sees no key. Dense (and blockwise) average all the
values there; cuDNN may give it anything. No loss reads a padding query, and its output reaches
only that query's own later layers, so that is the one place the paths may differ.

Splash (TPU's Pallas kernel; interpreted elsewhere, which is how the CPU tests run it) takes a
static causal or local mask plus a segment id per query and key, and soft-caps. Padding becomes
a key segment no query has, so any padding and packed segments are expressible; shared-prefix
branches and bidirectional blocks (Gemma 3's image tokens) are not. At run time the indices
must be the slots and each segment one run (as packing makes them). Its blocks are multiples
of 128, so rows are padded to one. A query that sees no key gets dense's average of the values
(found from the runs and the window, not from the kernel, whose answer there differs), and
passes no gradient into the kernel. GSPMD does not partition the kernel (a pallas_call); on a
mesh it wants a shard_map, which is parallel/'s to add.
"""
from __future__ import annotations

import functools
import warnings

import jax
import jax.numpy as jnp

from hone.models.blockwise import DEFAULT_BLOCK, blockwise_attention, filled_spec
from hone.models.masks import MaskSpec

_NO_SEGMENT = int(jnp.iinfo(jnp.int32).min)  # the segment of a padding key: no query has it


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
    return jax.lax.cond(cudnn_expressible(spec), fused, blocks, q, k, v)


def cudnn_expressible(spec: MaskSpec) -> jax.Array:
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
    if spec.q_bidirectional is not None:
        return "bidirectional blocks (image tokens) are not expressible"
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


def splash_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec | None, *,
                     scale: float, softcap: float | None = None, block: int = DEFAULT_BLOCK,
                     interpret: bool | None = None) -> jax.Array:
    """q [B, T, N, H], k/v [B, S, K, H] -> [B, T, N, H] before the output projection, the
    numbers of `blockwise_attention`. interpret: run the kernel in Pallas' interpreter (default:
    everywhere but on TPU)."""
    # Imported on use: only this path needs Pallas' TPU kernels.
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    spec = filled_spec(spec, b, t, s)

    def blocks(q, k, v):
        return blockwise_attention(q, k, v, spec, scale=scale, softcap=softcap,
                                   block_q=block, block_k=block)

    if spec.q_branch is not None or spec.q_bidirectional is not None or t != s:
        reason = ("shared-prefix branches are not expressible" if spec.q_branch is not None
                  else "bidirectional blocks (image tokens) are not expressible"
                  if spec.q_bidirectional is not None else "queries and keys differ in length")
        _warn_once(f"model.attention=splash: {reason}; using blockwise attention")
        return blocks(q, k, v)
    interpret = jax.default_backend() != "tpu" if interpret is None else interpret
    tp = -(-t // 128) * 128  # the kernel's blocks are multiples of 128 lanes
    blk = next(size for size in (512, 256, 128) if tp % size == 0)
    shape = (tp, tp)
    one = (sa.CausalMask(shape) if spec.window is None
           else sa.LocalMask(shape, (spec.window - 1, 0), 0))
    kernel = sa.make_splash_mqa_single_device(
        sa.MultiHeadMask([one] * (n // kv)), block_sizes=sa.BlockSizes(*(blk,) * 8),
        attn_logits_soft_cap=softcap, interpret=interpret)
    segment = (jnp.zeros((b, t), jnp.int32) if spec.q_segment is None
               else spec.q_segment.astype(jnp.int32))
    q_seg = jnp.pad(segment, ((0, 0), (0, tp - t)))  # [B, Tp]; padded queries are cropped
    k_seg = jnp.pad(jnp.where(spec.k_valid, segment, _NO_SEGMENT), ((0, 0), (0, tp - t)),
                    constant_values=_NO_SEGMENT)  # [B, Tp]
    empty = _sees_nothing(spec.k_valid, segment, spec.window)  # [B, T]

    def fused(q, k, v):
        pad = lambda x: jnp.pad(x, ((0, 0), (0, tp - t), (0, 0), (0, 0)))  # noqa: E731
        qs = pad(q * jnp.asarray(scale, q.dtype)).reshape(b, tp, kv, n // kv, h)
        qs = qs.transpose(0, 2, 3, 1, 4)  # [B, K, G, Tp, H]
        ks, vs = (pad(x).transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, Tp, H]

        def head(qh, kh, vh, qsg, ksg):  # [G, Tp, H], [Tp, H], [Tp, H], [Tp], [Tp]
            return kernel(qh, kh, vh, segment_ids=sa.SegmentIds(qsg, ksg))

        out = jax.vmap(jax.vmap(head, (0, 0, 0, None, None)))(qs, ks, vs, q_seg, k_seg)
        out = out.transpose(0, 3, 1, 2, 4)[:, :t]  # [B, T, K, G, H]
        mean_v = v.astype(jnp.float32).mean(1)[:, None, :, None, :]  # [B, 1, K, 1, H]
        out = jnp.where(empty[:, :, None, None, None], mean_v, out.astype(jnp.float32))
        return out.reshape(b, t, n, h).astype(q.dtype)

    try:
        jax.eval_shape(fused, q, k, v)
    except Exception as err:  # a head size or block the kernel does not take on this chip
        _warn_once(f"model.attention=splash: not available here ({type(err).__name__}: {err});"
                   " using blockwise attention")
        return blocks(q, k, v)
    return jax.lax.cond(splash_expressible(spec), fused, blocks, q, k, v)


def splash_expressible(spec: MaskSpec) -> jax.Array:
    """Scalar bool: are the indices the slots 0..T-1 and each row's segments runs (every
    segment id in one stretch of consecutive slots)?"""
    slots = jnp.arange(spec.q_index.shape[1], dtype=jnp.int32)
    ok = jnp.all(spec.q_index == slots) & jnp.all(spec.k_index == slots)
    if spec.q_segment is None:
        return ok
    segment = spec.q_segment
    runs = 1 + jnp.sum(segment[:, 1:] != segment[:, :-1], axis=1)  # [B]
    ordered = jnp.sort(segment, axis=1)
    distinct = 1 + jnp.sum(ordered[:, 1:] != ordered[:, :-1], axis=1)  # [B]
    return ok & jnp.all(runs == distinct)


def _sees_nothing(valid: jax.Array, segment: jax.Array, window: int | None) -> jax.Array:
    """[B, T]: query t has no valid key in its own segment's run up to t (and in its window),
    for slot indices and segments that are runs."""
    slots = jnp.arange(valid.shape[1], dtype=jnp.int32)
    last_valid = jax.lax.cummax(jnp.where(valid, slots, -1), axis=1)  # [B, T]
    starts = jnp.concatenate([jnp.ones_like(segment[:, :1], bool),
                              segment[:, 1:] != segment[:, :-1]], axis=1)
    run_start = jax.lax.cummax(jnp.where(starts, slots, 0), axis=1)  # [B, T]
    if window is not None:
        run_start = jnp.maximum(run_start, slots - window + 1)
    return last_valid < run_start


@functools.cache
def _warn_once(message: str) -> None:
    warnings.warn(message, stacklevel=4)
