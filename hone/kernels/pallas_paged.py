"""The rollout engine's decode attention over pages on accelerators: JAX's Pallas paged-attention
kernels (jax.experimental.pallas.ops.gpu.paged_attention on GPUs,
jax.experimental.pallas.ops.tpu.paged_attention on TPUs), which read each row's pages from the
pools [K, P, page, H] themselves instead of gathering a cache.

Both mask by length alone (a row attends to its first `lengths[b]` slots), so they serve the
layers whose decode mask is a prefix: full attention, soft-capped or not. A sliding-window layer
takes the XLA path (`Attention.attend_step`'s blockwise loop over pages). Neither kernel takes a
scale: the queries are scaled first, which is the same product. The TPU kernel reads keys and
values as bfloat16 whatever the pools hold, and lowers only where head_dim is a multiple of 128
(its blocks span the head dimension and Mosaic rejects a narrower one). On a TPU v5e it measured
slower than the XLA path, so the engine takes it only when asked (`PagedEngine(attention="tpu")`;
`hone.sampling.paged.paged_route`).

`impl` names the route: "gpu" and "tpu" compile the kernel for that backend; "gpu-interpret"
and "tpu-interpret" run the same kernel in Pallas's interpreter on any backend, which is how the
CPU test suite checks them against the XLA path (tests/sampling/test_pallas_paged.py).
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp

IMPLS = ("gpu", "tpu", "gpu-interpret", "tpu-interpret")


def _largest_divisor(n: int, cap: int) -> int:
    """The largest power of two <= cap that divides n (1 at least)."""
    d = 1
    while d * 2 <= cap and n % (d * 2) == 0:
        d *= 2
    return d


def paged_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, table: jax.Array,
                    lengths: jax.Array, scale: float, softcap: float | None,
                    impl: str) -> jax.Array:
    """q [B, N, H], pools [K, P, page, H], table [B, n] int32, lengths [B] int32 -> float32
    [B, N, H]: each row's attention over its first lengths[b] slots (0: zeros)."""
    if impl not in IMPLS:
        raise ValueError(f"unknown Pallas paged-attention route {impl!r}; allowed: {IMPLS}")
    q = q.astype(jnp.float32) * scale
    table, lengths = table.astype(jnp.int32), lengths.astype(jnp.int32)
    n = table.shape[1]
    interpret = impl.endswith("-interpret")
    if impl.startswith("gpu"):
        from jax.experimental.pallas.ops.gpu import paged_attention as gpu
        splits = _largest_divisor(n, 16)
        out = gpu.paged_attention(  # its products take q in the pools' dtype
            q.astype(k_pool.dtype), k_pool, v_pool, table, lengths, block_h=16,
            pages_per_compute_block=_largest_divisor(n // splits, 8), k_splits=splits,
            interpret=interpret, attn_logits_soft_cap=softcap)
        return out.astype(jnp.float32)
    from jax.experimental.pallas import tpu as pltpu
    from jax.experimental.pallas.ops.tpu.paged_attention import paged_attention as tpu
    context = pltpu.force_tpu_interpret_mode() if interpret else contextlib.nullcontext()
    with context:
        out = tpu(q, k_pool, v_pool, lengths, table, attn_logits_soft_cap=softcap,
                  pages_per_compute_block=_largest_divisor(n, 8))
    return out.astype(jnp.float32)
