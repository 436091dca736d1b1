"""Attention of query blocks over page pools, as XLA ops: the rollout engine's prefill (and the
reference of the Pallas kernels of hone/kernels/ragged_paged.py).

Rows of R query blocks, T tokens each (a prompt's chunk cut into blocks, or one decode step:
T = 1), each row with its own page table: row r's slot s is page table[r, s // page] at offset
s % page of the pools [K, P, page, H]. A loop over page columns reads, per step, one page of
every row (a gather of R pages, never a row's whole cache) and folds it into a running softmax
(maximum, normaliser and weighted sum carried from page to page), up to the last page any row
uses: a call costs what its rows hold, not what their tables could hold, so the engine can pass
every row's whole table and keep one program per row count.

Mask: a query at slot p sees key slot s when s <= p (and s > p - window with a sliding
window); a query of slot -1 (padding) sees nothing and gets a finite, ignored output. Keys past
a row's last query slot are never seen, so nothing past what the rows wrote counts.
Scores and softmax in float32, products in the queries' dtype (pages cast to it, as the
prefill's gathered cache was).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


# A masked key's score: a finite minus infinity (hone/models/masks.py's), so a query that sees
# nothing gets a finite, ignored output instead of NaN.
MASKED = float(jnp.finfo(jnp.float32).min)


def ragged_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, table: jax.Array,
                     q_pos: jax.Array, *, scale: float, softcap: float | None = None,
                     window: int | None = None, fixed: bool = False) -> jax.Array:
    """q [R, T, N, H], k/v pools [K, P, page, H], table [R, n], q_pos [R, T] -> [R, T, N, H]
    float32. fixed: loop over all n page columns (a trip count known when compiled; XLA:GPU
    reads a data-dependent loop's predicate on the host every step), else up to the last page
    a query can see."""
    r, t, n, h = q.shape
    kv, _, page, _ = k_pool.shape
    g = n // kv
    f32 = jnp.float32
    qg = q.reshape(r, t, kv, g, h)
    top_slot = jnp.max(q_pos)
    columns = table.shape[1] if fixed else jnp.clip(top_slot // page + 1, 0, table.shape[1])
    first = 0
    if window is not None and not fixed:  # page columns wholly before every row's window
        live = jnp.where(q_pos >= 0, q_pos, top_slot)
        first = jnp.clip((jnp.min(live) - window + 1) // page, 0, columns)

    def body(j, carry):
        top, norm, acc = carry  # [R, K, G, T], [R, K, G, T], [R, K, G, T, H]
        keys = jnp.take(k_pool, table[:, j], axis=1).astype(q.dtype)  # [K, R, page, H]
        values = jnp.take(v_pool, table[:, j], axis=1).astype(q.dtype)
        slots = j * page + jnp.arange(page, dtype=jnp.int32)
        diff = q_pos[:, :, None] - slots[None, None, :]  # [R, T, page]
        keep = diff >= 0
        if window is not None:
            keep &= diff < window
        x = jnp.einsum("RTKGH,KRSH->RKGTS", qg, keys, preferred_element_type=f32) * scale
        if softcap is not None:
            x = softcap * jnp.tanh(x / softcap)
        x = jnp.where(keep[:, None, None], x, MASKED)
        new_top = jnp.maximum(top, jnp.max(x, axis=-1))
        p = jnp.exp(x - new_top[..., None])
        fade = jnp.exp(top - new_top)
        weighted = jnp.einsum("RKGTS,KRSH->RKGTH", p.astype(values.dtype), values,
                              preferred_element_type=f32)
        return new_top, norm * fade + jnp.sum(p, axis=-1), acc * fade[..., None] + weighted

    init = (jnp.full((r, kv, g, t), MASKED, f32), jnp.zeros((r, kv, g, t), f32),
            jnp.zeros((r, kv, g, t, h), f32))
    _, norm, acc = jax.lax.fori_loop(first, columns, body, init)
    out = acc / jnp.maximum(norm, 1e-30)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, n, h)


def gathered_attention(q: jax.Array, k_pool: jax.Array, v_pool: jax.Array, table: jax.Array,
                       q_pos: jax.Array, *, scale: float, softcap: float | None = None,
                       window: int | None = None) -> jax.Array:
    """The same as `ragged_attention`, reading every row's whole table at once: its n pages
    gathered into a contiguous [K, R, n x page, H] cache, then two dense products and one
    softmax, as the static sampler's step is on its cache. Temporaries grow with R x n (the
    table's width, not the rows' lengths): for accelerators, where one large gather and dense
    products beat a loop of small ones."""
    r, t, n, h = q.shape
    kv, _, page, _ = k_pool.shape
    g = n // kv
    f32 = jnp.float32
    width = table.shape[1] * page
    keys = jnp.take(k_pool, table, axis=1).reshape(kv, r, width, h).astype(q.dtype)
    values = jnp.take(v_pool, table, axis=1).reshape(kv, r, width, h).astype(q.dtype)
    qg = q.reshape(r, t, kv, g, h)
    diff = q_pos[:, :, None] - jnp.arange(width, dtype=jnp.int32)[None, None]  # [R, T, S]
    keep = diff >= 0
    if window is not None:
        keep &= diff < window
    x = jnp.einsum("RTKGH,KRSH->RKGTS", qg, keys, preferred_element_type=f32) * scale
    if softcap is not None:
        x = softcap * jnp.tanh(x / softcap)
    x = jnp.where(keep[:, None, None], x, MASKED)
    p = jnp.exp(x - jnp.max(x, axis=-1, keepdims=True))
    norm = jnp.sum(p, axis=-1)
    out = jnp.einsum("RKGTS,KRSH->RKGTH", p.astype(values.dtype), values,
                     preferred_element_type=f32) / jnp.maximum(norm, 1e-30)[..., None]
    return out.transpose(0, 3, 1, 2, 4).reshape(r, t, n, h)
