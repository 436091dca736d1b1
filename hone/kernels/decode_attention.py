"""One decode step's attention through hone's CPU kernel (decode_attention.cc).

`decode_attention(q, k_cache, v_cache, mask, used, scale, softcap)` computes what
`Attention.attend_step` computes with XLA's operations (hone/models/attention.py): float32
scores, soft-capping, masking, softmax and the weighted sum of values, per row and head, reading
only the first `used` cache slots. The sampler's decode step uses it wherever it uses the packed
products (the CPU backend, one device, the kernels built).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hone.kernels.compiler import Unavailable, library


def decode_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array, mask: jax.Array,
                     used: jax.Array, scale: float, softcap: float | None) -> jax.Array:
    """q [B, N, H], k/v cache [B, K, S, H] (float32 or bfloat16, kv-head-major), mask [B, S]
    (may the query see slot s), used: leading slots that may hold keys -> float32 [B, N, H]."""
    if library() is None:  # also registers the kernel with XLA
        raise Unavailable("the CPU kernels are not available")
    call = jax.ffi.ffi_call("hone_decode_attention",
                            jax.ShapeDtypeStruct(q.shape, jnp.float32),
                            vmap_method="sequential")
    return call(q.astype(jnp.float32), k_cache, v_cache, mask.astype(jnp.bool_),
                jnp.asarray(used, jnp.int32), scale=np.float32(scale),
                softcap=np.float32(softcap or 0.0))


def paged_decode_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, table: jax.Array,
                           mask: jax.Array, used: jax.Array, scale: float,
                           softcap: float | None) -> jax.Array:
    """The same over page pools (hone/sampling/paged.py): k/v pools [K, P, page, H], table
    [B, n] int32 (row b's pages in order), mask [B, n x page] -> float32 [B, N, H]. Each row's
    first `used` slots are copied page by page next to the computation, which is then that of
    `decode_attention` on them (the same numbers)."""
    if library() is None:
        raise Unavailable("the CPU kernels are not available")
    call = jax.ffi.ffi_call("hone_paged_decode_attention",
                            jax.ShapeDtypeStruct(q.shape, jnp.float32),
                            vmap_method="sequential")
    return call(q.astype(jnp.float32), k_pool, v_pool, table.astype(jnp.int32),
                mask.astype(jnp.bool_), jnp.asarray(used, jnp.int32), scale=np.float32(scale),
                softcap=np.float32(softcap or 0.0))

