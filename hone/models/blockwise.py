"""Blockwise attention for training and prefill: the numbers of dense attention
(`Attention.attend`) in O(T x block) memory instead of O(T x S).

Queries are cut into blocks of `block_q`, keys into blocks of `block_k`. For each query block a
loop runs over the key blocks it can see, keeping an online softmax in float32 (running maximum,
normaliser and weighted sum of the values). The mask of a block pair is built from the spec's
vectors (`make_mask` on one block of each) and never for the whole row; the scores of a pair are
[B, K, G, block_q, block_k] and live only inside the loop.

Design choices:
- Skipping. Which block pairs can hold a visible (query, key) pair is decided from per-block
  minima and maxima of the indices, segments and branches over valid keys, OR-ed over the batch
  (`visible_blocks`). Each query block loops only over its visible key blocks (in order, from a
  compacted list), so causal rows do about half the pairs and a sliding window a band of them.
  The tests are conservative: a visited pair may still be fully masked, never the reverse.
- A query that sees no key at all gets what dense gives it: dense fills masked scores with a
  finite minimum, so such a row's softmax is uniform over ALL S keys and its output is the mean
  of the values (its gradient: dO / S into every key's dV, nothing into q or k). Such rows are
  padding (left padding, or a packed row's pad segment) that no loss reads, but matching them
  keeps the next layer's input, the logits and every gradient equal to dense everywhere.
- Gradients come from a custom VJP in the style of flash attention: the forward saves only the
  output and each row's log-sum-exp; the backward recomputes each visited pair's scores and
  probabilities, dV += P^T dO, dP = dO V^T, dS = P (dP - rowsum(dO * O)), through the soft-cap
  (d/dx c tanh(x / c) = 1 - (s / c)^2 with s the capped score), then dQ and dK from dS * scale.
  Nothing of size T x S is stored for the backward pass.
- Lengths that are not multiples of the blocks are padded inside (padded keys invalid, padded
  queries copy the last query's vectors so they widen no block's range) and the output cropped.
- Layout. The blocks are laid out heads before tokens once, outside the loops (queries
  [nq, B, K, G, bq, H], keys and values [nk, B, K, bk, H]), so every product inside them is a
  batched matrix product over (B, K) that XLA runs without copying an operand into another
  layout on each visit.
- Backward layout. The backward pass computes each pair's scores transposed, key-major
  [B, K, bk, M] with M = G x bq a query block's (head in group, token) rows: then P^T dO and
  dS^T Q read their tile as stored, and dQ is accumulated transposed (K^T dS^T) and turned back
  once per query block; query-major, XLA would copy P and dS into the other layout on every
  visit. Only [H, M] and [H, bk] copies of q, dO and k are made, once, outside the loops.
  What each layout saved, measured: docs/guides/long-context.md (the per-token paragraphs).
- Masked scores. The forward fills masked scores with -inf, so their exp is 0 without a
  second select (XLA otherwise wrote the tile again for each); the running maximum starts at
  the finite minimum dense uses, so a row with nothing visible yet gets exp(-inf) = 0, not NaN.
- Remat. Under `train.remat: save_attention` (hone/models/transformer.py `remat_policy`) the
  block's recomputation in the backward pass keeps what the forward saved for this VJP (the
  output, each row's log-sum-exp and emptiness: `SAVED`, by name) instead of running the
  forward loops again; only the projections before attention are recomputed. With causal
  attention that removes the forward's two products per visible pair, about a fifth of
  attention's work in a remat-full step, for N x H values in the compute dtype plus 5 bytes
  per head, per token and block, kept (docs/guides/long-context.md, "Choosing train.remat").
- Scores, softmax and the backward pass are float32 whatever the input dtype; as in dense, the
  probabilities are cast to the values' dtype for the product with the values.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from hone.models.masks import MASKED as _MASKED
from hone.models.masks import MaskSpec, make_mask

# Queries and keys per block: a pair's float32 scores at 256 x 256 stay in a CPU core's cache
# (the sizes tried: docs/guides/long-context.md), and 256 keeps the default 256-token rows on
# the dense path under model.attention=auto.
DEFAULT_BLOCK = 256

# The names of the forward's residuals that remat policy save_attention keeps ("Remat" above).
SAVED = ("attention_out", "attention_lse", "attention_empty")

_FAR = 2 ** 30  # an index beyond any real one, for minima and maxima over no tokens

_Q_FIELDS = ("q_index", "q_segment", "q_branch", "q_bidirectional")
_K_FIELDS = ("k_index", "k_valid", "k_segment", "k_branch", "k_bidirectional")


def filled_spec(spec: MaskSpec | None, b: int, t: int, s: int) -> MaskSpec:
    """The spec with its optional vectors given: q_index/k_index default to slots 0.. (causal
    over the slots), k_valid to all keys real."""
    spec = spec if spec is not None else MaskSpec(None, None, None)  # type: ignore[arg-type]
    arange = lambda n: jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))  # noqa: E731
    return dataclasses.replace(
        spec,
        q_index=arange(t) if spec.q_index is None else spec.q_index,
        k_index=arange(s) if spec.k_index is None else spec.k_index,
        k_valid=jnp.ones((b, s), jnp.bool_) if spec.k_valid is None else spec.k_valid)


def _pad_spec(spec: MaskSpec, tp: int, sp: int) -> MaskSpec:
    """Pad the query vectors to tp (copies of the last query) and the key vectors to sp
    (invalid keys)."""
    def pad(x, n, **how):
        if x is None or x.shape[1] == n:
            return x
        return jnp.pad(x, ((0, 0), (0, n - x.shape[1])), **how)

    fields = {f: pad(getattr(spec, f), tp, mode="edge") for f in _Q_FIELDS}
    fields |= {f: pad(getattr(spec, f), sp, mode="edge") for f in _K_FIELDS if f != "k_valid"}
    fields["k_valid"] = pad(spec.k_valid, sp, constant_values=False)
    return dataclasses.replace(spec, **fields)


def _ranges(x: jax.Array, keep: jax.Array | None, n: int):
    """Per block minimum and maximum [B, n] of x [B, n * blk] over the kept tokens."""
    b = x.shape[0]
    x = x.reshape(b, n, -1)
    if keep is None:
        return x.min(-1), x.max(-1)
    keep = keep.reshape(b, n, -1)
    return jnp.where(keep, x, _FAR).min(-1), jnp.where(keep, x, -_FAR).max(-1)


def visible_blocks(spec: MaskSpec, block_q: int, block_k: int) -> jax.Array:
    """Boolean [nq, nk]: may some query of block i see some key of block j in some row? spec's
    lengths must be multiples of the blocks (blockwise_attention pads them first)."""
    nq, nk = spec.q_index.shape[1] // block_q, spec.k_index.shape[1] // block_k
    valid = spec.k_valid
    q_lo, q_hi = _ranges(spec.q_index, None, nq)  # [B, nq]
    k_lo, k_hi = _ranges(spec.k_index, valid, nk)  # [B, nk]
    vis = valid.reshape(valid.shape[0], nk, -1).any(-1)[:, None, :]  # [B, 1, nk]
    causal = k_lo[:, None, :] <= q_hi[:, :, None]  # [B, nq, nk]
    if spec.q_bidirectional is not None:  # or: both hold tokens of one bidirectional block
        qd_lo, qd_hi = _ranges(spec.q_bidirectional, spec.q_bidirectional > 0, nq)
        kd_lo, kd_hi = _ranges(spec.k_bidirectional, valid & (spec.k_bidirectional > 0), nk)
        causal |= ((qd_lo[:, :, None] <= kd_hi[:, None, :])
                   & (kd_lo[:, None, :] <= qd_hi[:, :, None]))
    vis &= causal
    if spec.window is not None:
        vis &= q_lo[:, :, None] - k_hi[:, None, :] < spec.window
    if spec.q_segment is not None:
        qs_lo, qs_hi = _ranges(spec.q_segment, None, nq)
        ks_lo, ks_hi = _ranges(spec.k_segment, valid, nk)
        vis &= (qs_lo[:, :, None] <= ks_hi[:, None, :]) & (ks_lo[:, None, :] <= qs_hi[:, :, None])
    if spec.q_branch is not None:
        qb_lo, qb_hi = _ranges(spec.q_branch, None, nq)
        kb_lo, kb_hi = _ranges(spec.k_branch, valid, nk)
        prefix = (valid & (spec.k_branch == 0)).reshape(valid.shape[0], nk, -1).any(-1)
        vis &= prefix[:, None, :] | ((qb_lo[:, :, None] <= kb_hi[:, None, :])
                                     & (kb_lo[:, None, :] <= qb_hi[:, :, None]))
    return vis.any(0)


def blockwise_attention(q: jax.Array, k: jax.Array, v: jax.Array, spec: MaskSpec | None, *,
                        scale: float, softcap: float | None = None,
                        block_q: int = DEFAULT_BLOCK, block_k: int = DEFAULT_BLOCK) -> jax.Array:
    """q [B, T, N, H], k/v [B, S, K, H] (N a multiple of K), spec: queries [B, T], keys [B, S]
    -> [B, T, N, H] in q's dtype: softmax(mask(softcap(scale q k^T))) v per head, before the
    output projection. T and S may differ (a prefill chunk against cache slots)."""
    b, t, n, h = q.shape
    s, kv = k.shape[1], k.shape[2]
    block_q, block_k = min(block_q, t), min(block_k, s)
    nq, nk = -(-t // block_q), -(-s // block_k)
    tp, sp = nq * block_q, nk * block_k
    spec = _pad_spec(filled_spec(spec, b, t, s), tp, sp)
    vis = visible_blocks(spec, block_q, block_k)  # [nq, nk]
    # Each query block's visible key blocks first, in order: the loop runs over count[i] of them.
    order = jnp.argsort(~vis, axis=1, stable=True).astype(jnp.int32)  # [nq, nk]
    count = vis.sum(1, dtype=jnp.int32)  # [nq]
    qb = jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, 0)))
    qb = qb.reshape(b, nq, block_q, kv, n // kv, h).transpose(  # heads first: "Layout" above
        1, 0, 3, 4, 2, 5)  # [nq, B, K, G, bq, H]
    pad_k = lambda x: jnp.pad(x, ((0, 0), (0, sp - s), (0, 0), (0, 0))).reshape(  # noqa: E731
        b, nk, block_k, kv, h).transpose(1, 0, 3, 2, 4)  # [nk, B, K, bk, H]
    vecs = _blocked(spec, nq, nk)
    out = _attend(qb, pad_k(k), pad_k(v), vecs, order, count,
                  _Static(spec.window, scale, softcap, s))  # [nq, B, K, G, bq, H]
    return out.transpose(1, 0, 4, 2, 3, 5).reshape(b, tp, n, h)[:, :t]


@dataclasses.dataclass(frozen=True)
class _Static:
    window: int | None
    scale: float
    softcap: float | None
    keys: int  # S before padding: a query that sees no key averages the values of these


def _blocked(spec: MaskSpec, nq: int, nk: int) -> dict:
    """The spec's vectors cut into blocks, block-major: queries [nq, B, bq], keys [nk, B, bk]."""
    def cut(x, nblocks):
        return None if x is None else x.reshape(x.shape[0], nblocks, -1).swapaxes(0, 1)
    return ({f: cut(getattr(spec, f), nq) for f in _Q_FIELDS}
            | {f: cut(getattr(spec, f), nk) for f in _K_FIELDS})


def _pair_mask(qv: dict, kv: dict, window: int | None) -> jax.Array:
    """[B, bq, bk] from one query block's and one key block's vectors."""
    return make_mask(qv["q_index"], kv["k_index"], kv["k_valid"], window, qv["q_segment"],
                     kv["k_segment"], qv["q_branch"], kv["k_branch"],
                     q_bidirectional=qv["q_bidirectional"], k_bidirectional=kv["k_bidirectional"])


def _tile_mask(qv: dict, kv: dict, window: int | None) -> jax.Array:
    """The pair's mask for query-major scores, [B, 1, 1, bq, bk]."""
    return _pair_mask(qv, kv, window)[:, None, None]


def _tile_mask_t(qv: dict, kv: dict, window: int | None, groups: int) -> jax.Array:
    """The pair's mask for key-major scores, [B, 1, bk, G * bq]: keys by (head in group,
    query) rows."""
    m = _pair_mask(qv, kv, window).swapaxes(1, 2)  # [B, bk, bq]
    b, bk, bq = m.shape
    return jnp.broadcast_to(m[:, None, :, None, :], (b, 1, bk, groups, bq)).reshape(
        b, 1, bk, groups * bq)


def _key_block(vecs: dict, j: jax.Array) -> dict:
    return {f: None if vecs[f] is None else jax.lax.dynamic_index_in_dim(vecs[f], j, 0, False)
            for f in _K_FIELDS}


def _capped(x: jax.Array, st: _Static) -> jax.Array:
    """Raw products q . k -> scaled and (if the model caps them) soft-capped scores."""
    x = x * st.scale
    if st.softcap is not None:
        x = st.softcap * jnp.tanh(x / st.softcap)
    return x


def _scores(qi: jax.Array, kj: jax.Array, st: _Static) -> jax.Array:
    """qi [B, K, G, bq, H], kj [B, K, bk, H] -> float32 (capped) scores [B, K, G, bq, bk]."""
    return _capped(jnp.einsum("BKGTH,BKSH->BKGTS", qi, kj, preferred_element_type=jnp.float32),
                   st)


def _forward(qb, kb, vb, vecs, order, count, st: _Static):
    """qb [nq, B, K, G, bq, H], kb/vb [nk, B, K, bk, H] -> output [nq, B, K, G, bq, H] (q's
    dtype), log-sum-exp [nq, B, K, G, bq] (0 where a query sees no key) and that emptiness
    [nq, B, K, G, bq]."""
    _, b, kv, g, bq, h = qb.shape
    f32 = jnp.float32
    # What a query seeing no key gets in dense: the mean of the values over all real keys.
    mean_v = vb.astype(f32).sum((0, 3)) / st.keys  # [B, K, H]

    def one_query_block(_, xs):
        qi, qv, order_i, count_i = xs

        def visit(step, carry):
            top, norm, acc = carry  # [B, K, G, bq], [B, K, G, bq], [B, K, G, bq, H]
            j = order_i[step]
            kj = jax.lax.dynamic_index_in_dim(kb, j, 0, False)
            vj = jax.lax.dynamic_index_in_dim(vb, j, 0, False)
            keep = _tile_mask(qv, _key_block(vecs, j), st.window)  # [B, 1, 1, bq, bk]
            # Masked scores -inf: "Masked scores" above.
            x = jnp.where(keep, _scores(qi, kj, st), -jnp.inf)  # [B, K, G, bq, bk]
            new_top = jnp.maximum(top, x.max(-1))
            p = jnp.exp(x - new_top[..., None])
            fade = jnp.exp(top - new_top)
            pv = jnp.einsum("BKGTS,BKSH->BKGTH", p.astype(vj.dtype), vj,
                            preferred_element_type=f32)
            return new_top, norm * fade + p.sum(-1), acc * fade[..., None] + pv

        init = (jnp.full((b, kv, g, bq), _MASKED, f32), jnp.zeros((b, kv, g, bq), f32),
                jnp.zeros((b, kv, g, bq, h), f32))
        top, norm, acc = jax.lax.fori_loop(0, count_i, visit, init)
        empty = norm == 0.0  # [B, K, G, bq]
        out = jnp.where(empty[..., None], mean_v[:, :, None, None, :],
                        acc / jnp.where(empty, 1.0, norm)[..., None])
        lse = jnp.where(empty, 0.0, top + jnp.log(jnp.where(empty, 1.0, norm)))
        out = out.astype(qb.dtype)  # [B, K, G, bq, H]
        return None, (out, lse, empty)

    qvecs = {f: vecs[f] for f in _Q_FIELDS}
    _, (out, lse, empty) = jax.lax.scan(one_query_block, None, (qb, qvecs, order, count))
    return out, lse, empty


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _attend(qb, kb, vb, vecs, order, count, st: _Static):
    return _forward(qb, kb, vb, vecs, order, count, st)[0]


def _attend_fwd(qb, kb, vb, vecs, order, count, st: _Static):
    out, lse, empty = (checkpoint_name(x, name) for x, name in zip(
        _forward(qb, kb, vb, vecs, order, count, st), SAVED))
    return out, (qb, kb, vb, vecs, order, count, out, lse, empty)


def _attend_bwd(st: _Static, res, d_out):
    qb, kb, vb, vecs, order, count, out, lse, empty = res
    f32 = jnp.float32
    nq, b, kv, g, bq, h = qb.shape
    rows = g * bq  # a query block's (head in group, token) rows: M
    d_out = d_out.astype(f32)  # [nq, B, K, G, bq, H]
    delta = jnp.einsum("QBKGTH,QBKGTH->QBKGT", d_out, out.astype(f32))  # rowsum(dO * O)
    # Key-major ("Backward layout" above): scores transposed, [B, K, bk, M], so each of the
    # five products reads its operands as stored; only [*, H, M] and [*, H, bk] copies are made,
    # once, outside the loops.
    q_rows = qb.astype(f32).reshape(nq, b, kv, rows, h)
    do_rows = d_out.reshape(nq, b, kv, rows, h)
    k_f32 = kb.astype(f32)
    k_t = k_f32.swapaxes(-1, -2)  # [nk, B, K, H, bk]
    stats = lambda x: x.reshape(nq, b, kv, 1, rows)  # noqa: E731  [nq, B, K, 1, M]

    def one_query_block(carry, xs):
        qi, qi_t, qv, order_i, count_i, do_i, do_i_t, delta_i, lse_i = xs

        def visit(step, inner):
            dq_t, dk, dv = inner  # dq_t [B, K, H, M]
            j = order_i[step]
            kj = jax.lax.dynamic_index_in_dim(k_f32, j, 0, False)  # [B, K, bk, H]
            kj_t = jax.lax.dynamic_index_in_dim(k_t, j, 0, False)  # [B, K, H, bk]
            vj = jax.lax.dynamic_index_in_dim(vb, j, 0, False).astype(f32)
            keep = _tile_mask_t(qv, _key_block(vecs, j), st.window, g)  # [B, 1, bk, M]
            x = _capped(jnp.einsum("BKSH,BKHM->BKSM", kj, qi_t), st)  # [B, K, bk, M]
            p = jnp.where(keep, jnp.exp(x - lse_i), 0.0)  # [B, K, bk, M]
            dv_j = jnp.einsum("BKSM,BKMH->BKSH", p, do_i)
            dp = jnp.einsum("BKSH,BKHM->BKSM", vj, do_i_t)
            ds = p * (dp - delta_i)
            if st.softcap is not None:
                ds = ds * (1.0 - jnp.square(x / st.softcap))
            ds = ds * st.scale
            dq_t = dq_t + jnp.einsum("BKHS,BKSM->BKHM", kj_t, ds)
            dk_j = jnp.einsum("BKSM,BKMH->BKSH", ds, qi)
            add = lambda acc, new: jax.lax.dynamic_update_index_in_dim(  # noqa: E731
                acc, jax.lax.dynamic_index_in_dim(acc, j, 0, False) + new, j, 0)
            return dq_t, add(dk, dk_j), add(dv, dv_j)

        dk, dv = carry
        dq_t, dk, dv = jax.lax.fori_loop(0, count_i, visit,
                                         (jnp.zeros((b, kv, h, rows), f32), dk, dv))
        return (dk, dv), dq_t

    qvecs = {f: vecs[f] for f in _Q_FIELDS}
    zeros = jnp.zeros(kb.shape, f32)
    (dk, dv), dq_t = jax.lax.scan(
        one_query_block, (zeros, zeros),
        (q_rows, q_rows.swapaxes(-1, -2), qvecs, order, count, do_rows,
         do_rows.swapaxes(-1, -2), stats(delta), stats(lse)))
    dq = dq_t.swapaxes(-1, -2).reshape(qb.shape)
    # Queries that saw no key took the mean of the values: dO / S into every real key's dV.
    lost = jnp.einsum("QBKGT,QBKGTH->BKH", empty.astype(f32), d_out) / st.keys  # [B, K, H]
    nk, bk = kb.shape[0], kb.shape[3]
    real = (jnp.arange(nk * bk) < st.keys).reshape(nk, 1, 1, bk, 1)
    dv = dv + jnp.where(real, lost[None, :, :, None], 0.0)
    return (dq.astype(qb.dtype), dk.astype(kb.dtype), dv.astype(vb.dtype), None, None, None)


_attend.defvjp(_attend_fwd, _attend_bwd)
