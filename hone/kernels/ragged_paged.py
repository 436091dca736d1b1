"""Ragged paged attention as one Pallas TPU kernel: R rows (sequences) of T query tokens each
(T=1: a decode step; T=16..64: a prefill block) attend to their keys in paged pools, reading
only the pages they use, straight from HBM.

Layout. Queries q [R, T, N, H]; pools k_pool, v_pool [K, P, page, H] (float32 or bfloat16);
table [R, n] int32 holds row r's pages in order (slot s of row r lives in page
table[r, s // page] at offset s % page); q_pos [R, T] int32 the slot of each query token;
kv_len [R] int32 (keys exist in slots < kv_len[r]). GQA: query head h uses kv head h // (N // K).

Mask. The query at position p of row r attends slot s iff s <= p, s < kv_len[r] and, with a
window, s > p - window. Scores are (q . k) * scale, soft-capped (softcap * tanh(x / softcap))
when asked; the softmax and the output are float32. A query with nothing to attend (kv_len 0,
or q_pos < 0 for a padding token) outputs exactly 0.

Grid (R, K, nb), nb = cdiv(n, pages_per_block). The wrapper regroups q to float32 [R, K, M, H]
(G = N // K; rows ordered (token, head in group); M = T*G rounded up to whole 8-row tiles, the
extra rows padding queries), so step (r, k, j) holds one kv head's whole query group of row r
as an [M, H] matrix, and works on page block j: pages lo + j * ppb .. + ppb - 1 of the row.
lo and hi (the row's first and one-past-last needed page) come from the wrapper as
scalar-prefetched [R] arrays: hi = cdiv(min(kv_len, last query pos + 1), page), and
lo = (first query pos - window + 1) // page with a window, else 0. Steps with j past the row's
cdiv(hi - lo, ppb) blocks do nothing (pl.when), and pages at or past hi are never copied, so
reads and flops follow the keys used. Pages are copied from the pools (memory space ANY) with
one async copy per page into a double-buffered VMEM buffer [2, ppb, page, H]; block j + 1 is
started before block j is waited on. Each step runs one online-softmax update: running max and
normaliser in float32 VMEM scratch [M, 128] (the value broadcast across the lanes), the
unnormalised sum in the float32 output block itself, which stays resident across j and is
divided by the normaliser at the last step. The buffer slots past hi hold stale or
uninitialised data: their scores are masked with a select (never an added bias) and their
values zeroed (a select in float32), so NaN there can never leak into the output. Products
run in the pools' dtype (bfloat16 pools: bfloat16 q and weights on the MXU, float32 sums).

head_dim 64. Mosaic wants each block's last two dims divisible by (8, 128) or equal to the
array's. Every block whose last dim is H spans the array's whole last two dims: a pool page
(page, H), the query group and the output (M, H) of the [R, K, M, H] arrays; the page buffer
mirrors the page shape so each copy is a plain tile copy. There is no accumulator scratch of
width H (the output block accumulates). Per-query-row values are kept 128 lanes wide: the
max/normaliser scratch and the query positions (a [R, M, 128] float32 input, the position in
every lane; exact below 2 ** 24), each read back as an [M, 1] column by a lane max, the same
reduction as a block's row max. So H=64 needs no packing or copy of the pools; the only
64-wide work is the q.k contraction over H and the (M, H) updates, as in JAX's own
flash-attention kernel for head_dim 64. page should be a multiple of 8 (16 for bfloat16
pools; with a smaller bfloat16 page the block is widened to float32 before the products).

`impl`: "tpu" compiles the kernel; "tpu-interpret" runs the same pallas_call in Pallas's TPU
interpreter (which simulates the copies and fills uninitialised memory with NaN), on any
backend: that is how tests/kernels/test_ragged_paged.py checks it against ragged_reference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

IMPLS = ("tpu", "tpu-interpret")
LANES = 128
SLOTS_PER_BLOCK = 256  # default pages_per_block = this // page (at least 1, at most n)


def ragged_reference(q, k_pool, v_pool, table, q_pos, kv_len, *, scale, softcap=None,
                     window=None):
    """Dense reference: gather each row's pages into [R, n * page] slots, mask, softmax in
    float32. Same arguments and result as ragged_paged_attention (float32 [R, T, N, H])."""
    R, T, N, H = q.shape
    K, _, page, _ = k_pool.shape
    k = k_pool[:, table].astype(jnp.float32).reshape(K, R, -1, H)  # [K, R, S, H]
    v = v_pool[:, table].astype(jnp.float32).reshape(K, R, -1, H)
    k, v = (jnp.repeat(x, N // K, axis=0) for x in (k, v))  # [N, R, S, H]
    s = jnp.einsum("rtnh,nrsh->rnts", q.astype(jnp.float32), k,
                   precision=jax.lax.Precision.HIGHEST) * scale
    if softcap is not None:
        s = softcap * jnp.tanh(s / softcap)
    slot = jnp.arange(k.shape[2])[None, None, :]
    p = q_pos[:, :, None]
    mask = (slot <= p) & (slot < kv_len[:, None, None])
    if window is not None:
        mask &= slot > p - window
    mask = mask[:, None]  # [R, 1, T, S]
    s = jnp.where(mask, s, -jnp.inf)
    m = jnp.max(s, axis=-1, keepdims=True)
    w = jnp.where(mask, jnp.exp(s - jnp.where(jnp.isfinite(m), m, 0.0)), 0.0)
    denom = w.sum(-1, keepdims=True)
    w = w / jnp.where(denom > 0, denom, 1.0)
    return jnp.einsum("rnts,nrsh->rtnh", w, v, precision=jax.lax.Precision.HIGHEST)


def _column(ref):
    """[rows, 128] lane-broadcast scratch -> [rows, 1] (a lane max, as for a block's row max)."""
    return jnp.max(ref[...], axis=1, keepdims=True)


def _kernel(tbl_ref, len_ref, lo_ref, hi_ref,  # scalar prefetch (SMEM)
            q_ref, pos_ref, k_hbm, v_hbm,  # inputs
            o_ref,  # output: [M, H] float32, the running sum until the last step
            kbuf, vbuf, sems, m_ref, l_ref,  # scratch
            *, scale, softcap, window, ppb, n, cdtype):
    r, h, j = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    _, _, page, hd = kbuf.shape
    S = ppb * page
    lo, hi, kvl = lo_ref[r], hi_ref[r], len_ref[r]
    nblk = jax.lax.div(hi - lo + ppb - 1, ppb)  # non-negative: truncation is floor

    def copies(blk, slot):
        """The block's page copies, each with its condition (page < hi)."""
        out = []
        for i in range(ppb):
            pg = lo + blk * ppb + i
            idx = tbl_ref[r * n + jnp.minimum(pg, n - 1)]
            kc = pltpu.make_async_copy(k_hbm.at[h, idx], kbuf.at[slot, i], sems.at[0, slot])
            vc = pltpu.make_async_copy(v_hbm.at[h, idx], vbuf.at[slot, i], sems.at[1, slot])
            out.append((pg < hi, kc, vc))
        return out

    def start(blk, slot):
        for cond, kc, vc in copies(blk, slot):
            @pl.when(cond)
            def _():
                kc.start()
                vc.start()

    def wait(blk, slot):
        for cond, kc, vc in copies(blk, slot):
            @pl.when(cond)
            def _():
                kc.wait()
                vc.wait()

    @pl.when(j == 0)
    def _init():
        m_ref[...] = jnp.full(m_ref.shape, -jnp.inf, jnp.float32)
        l_ref[...] = jnp.zeros(l_ref.shape, jnp.float32)
        o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

        @pl.when(nblk > 0)
        def _():
            start(0, 0)

    @pl.when(j < nblk)
    def _step():
        slot = jax.lax.rem(j, 2)

        @pl.when(j + 1 < nblk)
        def _():
            start(j + 1, 1 - slot)

        wait(j, slot)
        k = kbuf[slot]
        v = vbuf[slot]
        if cdtype != k.dtype:  # a bfloat16 page of fewer than 16 rows: widen first
            k, v = k.astype(cdtype), v.astype(cdtype)
        k, v = k.reshape(S, hd), v.reshape(S, hd)
        base = (lo + j * ppb) * page  # slot of the block's first row
        # Rows past min(kv_len, hi * page) are stale or garbage: zero them (0 * NaN is NaN).
        end = jnp.minimum(kvl, hi * page)
        v_ok = base + jax.lax.broadcasted_iota(jnp.int32, (S, hd), 0) < end
        v = jnp.where(v_ok, v.astype(jnp.float32), 0.0).astype(cdtype)  # select in float32

        q = q_ref[...].astype(cdtype)
        s = jax.lax.dot_general(q, k, (((1,), (1,)), ((), ())),
                                preferred_element_type=jnp.float32) * scale  # [M, S]
        if softcap is not None:
            s = softcap * jnp.tanh(s / softcap)
        pos = _column(pos_ref)  # [M, 1] float32: exact below 2 ** 24
        col = base + jax.lax.broadcasted_iota(jnp.int32, s.shape, 1)
        colf = col.astype(jnp.float32)
        mask = (colf <= pos) & (col < kvl)
        if window is not None:
            mask = mask & (colf > pos - float(window))
        s = jnp.where(mask, s, -jnp.inf)

        m_prev, l_prev = _column(m_ref), _column(l_ref)
        m_new = jnp.maximum(m_prev, jnp.max(s, axis=1, keepdims=True))
        m_use = jnp.where(m_new == -jnp.inf, 0.0, m_new)  # nothing seen yet: no NaN
        p = jnp.exp(s - m_use)  # masked: exp(-inf) = 0
        alpha = jnp.exp(m_prev - m_use)
        l_new = alpha * l_prev + jnp.sum(p, axis=1, keepdims=True)
        pv = jnp.dot(p.astype(cdtype), v, preferred_element_type=jnp.float32)
        o_ref[...] = alpha * o_ref[...] + pv
        m_ref[...] = jnp.broadcast_to(m_new, m_ref.shape)
        l_ref[...] = jnp.broadcast_to(l_new, l_ref.shape)

    @pl.when(j == pl.num_programs(2) - 1)
    def _finish():
        l = _column(l_ref)
        o_ref[...] = jnp.where(l > 0, o_ref[...] / jnp.where(l > 0, l, 1.0), 0.0)


def _page_range(q_pos, kv_len, page, n, window):
    """Per row: the first and one-past-last page any of its queries needs ([R] int32 each)."""
    valid = q_pos >= 0
    last = jnp.max(jnp.where(valid, q_pos, -1), axis=1)
    end = jnp.clip(jnp.minimum(kv_len, last + 1), 0, n * page)
    hi = (end + page - 1) // page
    if window is None:
        return jnp.zeros_like(hi), hi
    first = jnp.min(jnp.where(valid, q_pos, jnp.iinfo(jnp.int32).max), axis=1)
    lo = jnp.maximum(first - window + 1, 0) // page
    return jnp.minimum(lo, hi), hi


def ragged_paged_attention(q, k_pool, v_pool, table, q_pos, kv_len, *, scale: float,
                           softcap: float | None = None, window: int | None = None,
                           impl: str = "tpu", pages_per_block: int | None = None) -> jax.Array:
    """q [R, T, N, H], pools [K, P, page, H], table [R, n], q_pos [R, T], kv_len [R] ->
    float32 [R, T, N, H] (see the module docstring for the mask). pages_per_block: pages per
    grid step (default SLOTS_PER_BLOCK // page), clipped to [1, n]."""
    if impl not in IMPLS:
        raise ValueError(f"unknown ragged paged-attention route {impl!r}; allowed: {IMPLS}")
    R, T, N, H = q.shape
    K, _, page, Hk = k_pool.shape
    n = table.shape[1]
    if k_pool.shape != v_pool.shape or k_pool.dtype != v_pool.dtype or Hk != H:
        raise ValueError(f"pools {k_pool.shape} {k_pool.dtype} and {v_pool.shape} "
                         f"{v_pool.dtype} do not match q's head_dim {H}")
    if N % K:
        raise ValueError(f"{N} query heads do not divide into {K} kv heads")
    if window is not None and window <= 0:
        raise ValueError(f"window must be positive, got {window}")
    G = N // K
    ppb = pages_per_block or max(1, SLOTS_PER_BLOCK // page)
    ppb = max(1, min(int(ppb), n))
    nb = pl.cdiv(n, ppb)
    dtype = k_pool.dtype
    sub = 8 * (4 // dtype.itemsize)  # rows per (sublane) tile
    cdtype = dtype if page % sub == 0 else jnp.dtype(jnp.float32)

    table, q_pos, kv_len = (x.astype(jnp.int32) for x in (table, q_pos, kv_len))
    lo, hi = _page_range(q_pos, kv_len, page, n, window)
    # Query rows (t, g) per kv head, padded to whole 8-row tiles with padding queries (q_pos -1,
    # output 0, dropped below); float32 (cast to the products' dtype in the kernel).
    TG = T * G
    M = pl.cdiv(TG, 8) * 8
    qg = q.astype(jnp.float32).reshape(R, T, K, G, H).transpose(0, 2, 1, 3, 4)
    qg = jnp.pad(qg.reshape(R, K, TG, H), ((0, 0), (0, 0), (0, M - TG), (0, 0)))
    # [R, M, 128]: row (t, g) holds q_pos[r, t] in every lane (float32, exact below 2 ** 24)
    pos = jnp.pad(jnp.repeat(q_pos, G, axis=1), ((0, 0), (0, M - TG)), constant_values=-1)
    pos = jnp.broadcast_to(pos.astype(jnp.float32)[:, :, None], (R, M, LANES))

    kernel = functools.partial(_kernel, scale=float(scale), window=window, ppb=ppb, n=n,
                               softcap=None if softcap is None else float(softcap),
                               cdtype=cdtype)
    group = pl.BlockSpec((None, None, M, H), lambda r, h, j, *_: (r, h, 0, 0))
    out = pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=4,
            grid=(R, K, nb),
            in_specs=[
                group,
                pl.BlockSpec((None, M, LANES), lambda r, h, j, *_: (r, 0, 0)),
                pl.BlockSpec(memory_space=pl.ANY),
                pl.BlockSpec(memory_space=pl.ANY),
            ],
            out_specs=group,
            scratch_shapes=[
                pltpu.VMEM((2, ppb, page, H), dtype),
                pltpu.VMEM((2, ppb, page, H), dtype),
                pltpu.SemaphoreType.DMA((2, 2)),
                pltpu.VMEM((M, LANES), jnp.float32),
                pltpu.VMEM((M, LANES), jnp.float32),
            ],
        ),
        out_shape=jax.ShapeDtypeStruct((R, K, M, H), jnp.float32),
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=pltpu.InterpretParams() if impl == "tpu-interpret" else False,
        name="ragged_paged_attention",
    )(table.reshape(-1), kv_len, lo, hi, qg, pos, k_pool, v_pool)
    out = out[:, :, :TG].reshape(R, K, T, G, H)
    return out.transpose(0, 2, 1, 3, 4).reshape(R, T, N, H)
