"""Grouped-query attention with optional q/k bias, q/k RMSNorm, logit soft-capping and sliding
windows, and the choice of how it is computed: dense (all scores [B, K, G, T, S] at once) or
blockwise (hone/models/blockwise.py). Masks (causality, padding, packing, windows, branches)
are hone/models/masks.py's.

Queries are grouped as [B, T, K, G, H] so each KV head is read once for its G query heads (no
repeat of keys and values in memory). Scores and softmax are float32 whatever the compute dtype.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from hone.kernels import packed as packed_kernel
from hone.kernels.decode_attention import decode_attention, paged_decode_attention
from hone.kernels.pallas_paged import paged_attention as pallas_paged_attention
from hone.models.blockwise import DEFAULT_BLOCK, blockwise_attention
from hone.models.config import ModelConfig
from hone.models.fused_attention import cudnn_attention, splash_attention
from hone.models.layers import RMSNorm, apply_rope, param
from hone.models.linear import Linear
from hone.models.masks import MASKED as _MASKED
from hone.models.masks import MaskSpec, make_mask  # noqa: F401  (make_mask: callers import it here)

# Cache slots a decode step reads per block (Attention.attend_step).
DECODE_BLOCK = 64


def attention_path(impl: str, t: int, s: int, block: int) -> str:
    """Which implementation `Attention.attend` runs for T queries against S keys given a mask
    spec: impl is model.attention ("auto", "dense", "blockwise", "cudnn", "splash").

    auto: dense when the whole row fits in one block (the same numbers and memory either way,
    and one fewer loop to compile), else the backend's fused kernel where hone has a path to it
    (cuDNN on GPU, splash on a single TPU chip; each falls back to blockwise for masks it
    cannot express), else blockwise.
    """
    if impl == "auto":
        if t <= block and s <= block:
            return "dense"
        backend = jax.default_backend()
        # Splash is a pallas_call, which GSPMD does not partition: on a mesh it would run
        # replicated (it needs a shard_map there), so auto takes it on a single chip only.
        tpu = "splash" if jax.device_count() == 1 else "blockwise"
        impl = {"gpu": "cudnn", "tpu": tpu}.get(backend, "blockwise")
    if impl not in ("dense", "blockwise", "cudnn", "splash"):
        raise ValueError(f"unknown attention implementation {impl!r}")
    return impl


def dense_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, *,
                    scale: float, softcap: float | None = None):
    """All scores at once: q [B, T, N, H], k/v [B, S, K, H], mask [B, T, S] -> (output
    [B, T, N, H] before the output projection, probabilities [B, K, G, T, S]), both in v's
    dtype. The reference the blockwise path is tested against."""
    b, t, n, h = q.shape
    kv = k.shape[2]
    qg = q.reshape(b, t, kv, n // kv, h)  # [B, T, K, G, H]
    scores = jnp.einsum("BTKGH,BSKH->BKGTS", qg, k, preferred_element_type=jnp.float32) * scale
    if softcap is not None:
        scores = softcap * jnp.tanh(scores / softcap)
    scores = jnp.where(mask[:, None, None, :, :], scores, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("BKGTS,BSKH->BTKGH", probs, v).reshape(b, t, n, h), probs


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        d, n, k, h = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.num_kv_heads = k
        self.q = Linear((d,), (n, h), ("embed", "heads", "head_dim"), dtype, rngs)
        self.k = Linear((d,), (k, h), ("embed", "kv_heads", "head_dim"), dtype, rngs)
        self.v = Linear((d,), (k, h), ("embed", "kv_heads", "head_dim"), dtype, rngs)
        self.o = Linear((n, h), (d,), ("heads", "head_dim", "embed"), dtype, rngs)
        if cfg.attention_bias:
            self.q_bias = param(None, (n, h), ("heads", "head_dim"), dtype, "zeros")
            self.k_bias = param(None, (k, h), ("kv_heads", "head_dim"), dtype, "zeros")
            self.v_bias = param(None, (k, h), ("kv_heads", "head_dim"), dtype, "zeros")
        else:
            self.q_bias = self.k_bias = self.v_bias = None
        if cfg.qk_norm:
            self.q_norm = RMSNorm(h, cfg.norm_eps, cfg.norm_offset, dtype, name="head_dim")
            self.k_norm = RMSNorm(h, cfg.norm_eps, cfg.norm_offset, dtype, name="head_dim")
        else:
            self.q_norm = self.k_norm = None
        self.scale = (cfg.query_pre_attn_scalar or h) ** -0.5
        self.softcap = cfg.attn_logit_softcap
        # q, k and v's weights side by side in column panels: set by the sampler's decode step
        # only (hone/sampling/engine.py), one kernel product instead of three.
        self.packed_qkv: jax.Array | None = nnx.data(None)

    def project_qkv(self, x: jax.Array, cos: jax.Array, sin: jax.Array):
        """x [B, T, D] -> rotated q [B, T, N, H], rotated k [B, T, K, H], v [B, T, K, H]."""
        if self.packed_qkv is not None:
            q, k, v = self._fused_qkv(x)
        else:
            q, k, v = self.q(x), self.k(x), self.v(x)
        if self.q_bias is not None:
            q, k, v = q + self.q_bias[...], k + self.k_bias[...], v + self.v_bias[...]
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _fused_qkv(self, x: jax.Array):
        """q, k, v from one product by the panels of [Wq | Wk | Wv], each part then finished by
        its own Linear (LoRA, output shape)."""
        parts = (self.q, self.k, self.v)
        y = packed_kernel.matmul(x, self.packed_qkv, sum(p.out_features for p in parts))
        y = y.astype(x.dtype)
        out, at = [], 0
        for part in parts:
            out.append(part.finish(x, y[..., at:at + part.out_features]))
            at += part.out_features
        return out

    def attend(self, q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array | MaskSpec,
               return_probs: bool = False, impl: str | Callable = "auto",
               block: int = DEFAULT_BLOCK):
        """q [B, T, N, H], k/v [B, S, K, H], mask: boolean [B, T, S] or the spec it is built from
        -> output [B, T, D]; with return_probs also the float32 attention probabilities
        [B, N, T, S]. impl/block choose the implementation (`attention_path`) when the mask is
        a spec; a built mask, or return_probs (the maps need all of T x S anyway), is dense.
        impl may also be a function `f(q, k, v, spec, *, scale, softcap, block)` (the
        Transformer's sequence_attention), called in place of the choice."""
        b, t, n, h = q.shape
        if isinstance(mask, MaskSpec) and callable(impl) and not return_probs:
            return self.o(impl(q, k, v, mask, scale=self.scale, softcap=self.softcap,
                               block=block))
        if isinstance(mask, MaskSpec):
            path = "dense" if return_probs else attention_path(impl, t, k.shape[1], block)
            if path == "blockwise":
                return self.o(blockwise_attention(q, k, v, mask, scale=self.scale,
                                                  softcap=self.softcap, block_q=block,
                                                  block_k=block))
            if path in ("cudnn", "splash"):  # the kernel where the mask allows, else blockwise
                fused = cudnn_attention if path == "cudnn" else splash_attention
                return self.o(fused(q, k, v, mask, scale=self.scale, softcap=self.softcap,
                                    block=block))
            mask = mask.build()
        out, probs = dense_attention(q, k, v, mask, scale=self.scale, softcap=self.softcap)
        out = self.o(out)
        if return_probs:
            return out, probs.astype(jnp.float32).reshape(b, n, t, probs.shape[-1])
        return out

    def attend_step(self, q: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
                    mask: jax.Array, used: jax.Array | None = None,
                    block: int = DECODE_BLOCK, kernel: bool = False,
                    pages: jax.Array | None = None, pallas: str | None = None) -> jax.Array:
        """One query per row against a cache: q [B, 1, N, H], k/v cache [B, K, S, H]
        (kv-head-major), mask [B, 1, S] -> output [B, 1, D]. `used`: how many leading cache
        slots may hold keys (None: all S); past it, whole blocks are not read and slots of a
        partly used block get no weight. A cache of at most `block` slots is read whole, and
        `mask` must exclude its slots past `used` (the sampler's does: they are not valid).

        The same attention as `attend`, written as float32 products and sums instead of dot
        products (with a single query, XLA:CPU otherwise transposes every layer's cache before
        two small batched matrix products). A cache longer than `block` slots is read in blocks
        with a running softmax (maximum, normaliser and weighted sum carried from block to
        block), and only the blocks below `used`: a decode step costs what the sequence so far
        holds, not what the cache could hold. kernel: compute it all in hone's CPU kernel
        (hone/kernels/decode_attention.py; the same numbers up to float32 summation order).
        pages [B, n]: k/v cache are page pools [K, P, page, H] (hone/sampling/paged.py) and row
        b's cache is its pages pages[b] in order; the loop reads one page per row as its block
        (block = page), so the cache is never gathered whole, and runs even for one page; with
        `kernel`, hone's kernel reads the pages itself; with `pallas` (a route of
        hone/kernels/pallas_paged.py, for masks that are a prefix of each row: no sliding
        window), JAX's Pallas paged-attention kernel does.
        """
        b, _, n, h = q.shape
        kv, s = self.num_kv_heads, k_cache.shape[2]
        if pages is not None:
            block, s = k_cache.shape[2], pages.shape[1] * k_cache.shape[2]
        if pages is not None and pallas is not None:
            lengths = jnp.sum(mask[:, 0], axis=-1, dtype=jnp.int32)
            out = pallas_paged_attention(q[:, 0], k_cache, v_cache, pages, lengths, self.scale,
                                         self.softcap, pallas)
            return self.o(out.astype(q.dtype).reshape(b, 1, n, h))
        if kernel:
            used = jnp.int32(s) if used is None else used
            if pages is not None:
                out = paged_decode_attention(q[:, 0], k_cache, v_cache, pages, mask[:, 0], used,
                                             self.scale, self.softcap)
            else:
                out = decode_attention(q[:, 0], k_cache, v_cache, mask[:, 0], used, self.scale,
                                       self.softcap)
            return self.o(out.astype(q.dtype).reshape(b, 1, n, h))
        f32 = jnp.float32
        qg = q.reshape(b, kv, n // kv, 1, h).astype(f32)
        mask = mask[:, None, :, :]  # [B, 1, 1, S]

        def scores_of(keys, keep):
            x = jnp.sum(qg * keys[:, :, None].astype(f32), axis=-1) * self.scale  # [B,K,G,s]
            if self.softcap is not None:
                x = self.softcap * jnp.tanh(x / self.softcap)
            return jnp.where(keep, x, _MASKED)

        def weighted(p, values):
            return jnp.sum(p[..., None] * values[:, :, None].astype(f32), axis=3)  # [B,K,G,H]

        if s <= block and pages is None:
            out = weighted(jax.nn.softmax(scores_of(k_cache, mask), axis=-1), v_cache)
        else:
            used = jnp.int32(s) if used is None else jnp.minimum(used, s)

            def read(cache, lo, j):  # the block's keys or values [B, K, block, H]
                if pages is None:
                    return jax.lax.dynamic_slice_in_dim(cache, lo, block, axis=2)
                return jnp.take(cache, pages[:, j], axis=1).transpose(1, 0, 2, 3)

            def body(j, carry):
                top, norm, acc = carry
                # The last block may overlap the one before it; its first slots are skipped.
                lo = jnp.minimum(j * block, s - block)
                slots = lo + jnp.arange(block)
                keep = (jax.lax.dynamic_slice_in_dim(mask, lo, block, axis=3)
                        & (slots >= j * block) & (slots < used))
                x = scores_of(read(k_cache, lo, j), keep)
                new_top = jnp.maximum(top, jnp.max(x, axis=-1))
                p = jnp.exp(x - new_top[..., None])
                fade = jnp.exp(top - new_top)
                return (new_top, norm * fade + jnp.sum(p, axis=-1),
                        acc * fade[..., None] + weighted(p, read(v_cache, lo, j)))

            g = n // kv
            init = (jnp.full((b, kv, g), _MASKED, f32), jnp.zeros((b, kv, g), f32),
                    jnp.zeros((b, kv, g, h), f32))
            _, norm, acc = jax.lax.fori_loop(0, (used + block - 1) // block, body, init)
            out = acc / norm[..., None]
        return self.o(out.astype(q.dtype).reshape(b, 1, n, h))

    def __call__(self, x: jax.Array, cos: jax.Array, sin: jax.Array,
                 mask: jax.Array | MaskSpec, return_probs: bool = False,
                 impl: str | Callable = "auto",
                 block: int = DEFAULT_BLOCK):
        """Self-attention over the sequence itself (training and scoring; no cache)."""
        q, k, v = self.project_qkv(x, cos, sin)
        return self.attend(q, k, v, mask, return_probs, impl, block)
