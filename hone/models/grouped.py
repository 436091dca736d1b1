"""Grouped matrix products: rows sorted by expert, each expert's rows times that expert's matrix.

A routed MLP's N*k (token, expert) pairs are laid out once per call (`layout`): sorted by
expert, each expert's rows padded with zero rows up to a multiple of a row tile T. Every
product of the expert MLP then runs on that layout (`gmm`): y[rows of e] = x[rows of e] @ w[e]
for stacked w [E, I, O]. Two ways to compute it, chosen at trace time:

- "ragged": `jax.lax.ragged_dot` with one group per expert (T = 1, no padding). On GPU and TPU
  XLA implements it as a grouped matmul whose work follows the rows; XLA:CPU (jax 0.10.2)
  lowers it to a masked product over every expert (E times the work).
- "tiles" (the CPU default): a loop over the experts that have rows, each slicing its matrix
  out of the stack once, and inside it a loop over that expert's tiles, each one [T, I] x
  [I, O] product. Work is (N*k + at most E*(T-1) padding rows) x I x O, and only the chosen
  experts' weights are read. The backward pass is written out: dx with the same loops against
  w transposed, dw as a second pair of loops that sums each expert's x^T @ dy over its tiles
  into its slot of an [E, I, O] buffer (separate loops, so a frozen w, as under LoRA, costs
  nothing: nobody reads their result and XLA removes them).

The rows' static count is bounded by T * floor((N*k + E*(T-1)) / T): sum_e ceil(n_e / T)
tiles cannot exceed it. The loops run over the tiles actually used.

Frozen quantized experts (QLoRA) pass `QuantizedWeight` storage instead of an array: the tile
loop dequantizes one expert per tile, the ragged path the whole stack.

Letters: P = N*k pairs, R rows of the padded layout, E experts, I/O a product's input/output
width, T rows per tile.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from hone.models.quant import QuantizedWeight, dequantize_codes

_F32 = jnp.float32


class Layout(NamedTuple):
    """Where each (token, expert) pair sits in the sorted, padded rows."""

    dest: jax.Array  # [P] row of each pair (pairs in (token, slot) order)
    pair: jax.Array  # [R] pair each row holds; P (out of range) for a padding row
    sizes: jax.Array  # [E] rows per expert, padded to the tile: ragged_dot's group sizes
    first_tile: jax.Array  # [E] each expert's first tile (its rows start at first_tile * T)
    active: jax.Array  # [E] the experts with rows first (ascending), then the others
    num_active: jax.Array  # [] experts with rows (the outer loop's trip count)
    tile: int  # T (1 for "ragged")
    method: str  # "ragged" or "tiles"


def cpu_tile(pairs: int, experts: int) -> int:
    """The row tile of the CPU loop: large enough for an efficient product, small enough that
    padding (at most T-1 rows per expert) stays a small share of the pairs."""
    tile = 128
    while tile > 8 and experts * tile > pairs // 4:
        tile //= 2
    return tile


def default_method() -> str:
    """ "tiles" where the default backend is the CPU, else "ragged". Decided at trace time from
    jax.default_backend(): a computation placed on a CPU device while another backend is the
    default would take the ragged path (correct, only slower)."""
    return "tiles" if jax.default_backend() == "cpu" else "ragged"


def layout(chosen: jax.Array, experts: int, method: str) -> Layout:
    """The layout of the pairs chosen [N, k] (expert ids) for `method` ("ragged" or "tiles")."""
    n, k = chosen.shape
    p = n * k
    tile = cpu_tile(p, experts) if method == "tiles" else 1
    flat = chosen.reshape(-1)  # [P]
    sizes = jnp.bincount(flat, length=experts).astype(jnp.int32)  # [E] pairs per expert
    padded = (sizes + tile - 1) // tile * tile  # [E]
    ends = jnp.cumsum(padded)  # [E] end row of each expert's block
    order = jnp.argsort(flat, stable=True)  # [P] pairs grouped by expert
    expert = flat[order]  # [P] expert of each sorted pair
    rank = jnp.arange(p, dtype=jnp.int32) - (jnp.cumsum(sizes) - sizes)[expert]  # [P]
    dest = jnp.zeros(p, jnp.int32).at[order].set(ends[expert] - padded[expert] + rank)  # [P]
    rows = (p + experts * (tile - 1)) // tile * tile  # R, static
    pair = jnp.full(rows, p, jnp.int32).at[dest].set(jnp.arange(p, dtype=jnp.int32))  # [R]
    active = jnp.argsort(sizes == 0, stable=True).astype(jnp.int32)  # [E]
    num_active = jnp.sum(sizes > 0).astype(jnp.int32)
    return Layout(dest, pair, padded, (ends - padded) // tile, active, num_active, tile,
                  method)


def gather_rows(x: jax.Array, lay: Layout) -> jax.Array:
    """x [N, D] -> the layout's rows [R, D] (padding rows zero)."""
    return _gather_rows(x, lay.pair, lay.dest)


def scatter_rows(y: jax.Array, lay: Layout) -> jax.Array:
    """The layout's rows [R, D] -> each pair's row [P, D], pairs in (token, slot) order."""
    return _scatter_rows(y, lay.pair, lay.dest)


# Both directions are gathers, forward and backward: a row holds one pair, a pair sits in one
# row, and token n's pairs are n*k .. n*k+k-1. Left to autodiff, each backward pass is a
# scatter-add, which XLA:CPU runs as a serial loop. (With the per-expert loops below: 5-8%
# less CPU time for a routed MLP's forward and backward pass than one flat loop over tiles
# with autodiff's scatters, measured on this file's benchmark shapes.)
@jax.custom_vjp
def _gather_rows(x, pair, dest):
    k = dest.shape[0] // x.shape[0]
    return jnp.take(x, pair // k, axis=0, mode="fill", fill_value=0)  # [R, D]


def _gather_rows_fwd(x, pair, dest):
    return _gather_rows(x, pair, dest), (pair, dest, x.shape[0])


def _gather_rows_bwd(residuals, g):
    pair, dest, n = residuals
    rows = jnp.take(g, dest.reshape(n, -1), axis=0)  # [N, k, D] the rows of token n's pairs
    return jnp.sum(rows, axis=1), None, None


_gather_rows.defvjp(_gather_rows_fwd, _gather_rows_bwd)


@jax.custom_vjp
def _scatter_rows(y, pair, dest):
    return jnp.take(y, dest, axis=0)  # [P, D]


def _scatter_rows_fwd(y, pair, dest):
    return _scatter_rows(y, pair, dest), (pair, dest)


def _scatter_rows_bwd(residuals, g):
    pair, dest = residuals
    return jnp.take(g, pair, axis=0, mode="fill", fill_value=0), None, None  # [R, D]


_scatter_rows.defvjp(_scatter_rows_fwd, _scatter_rows_bwd)


def gmm(x: jax.Array, w, lay: Layout) -> jax.Array:
    """x [R, I] @ w[expert of the row] -> [R, O] in x's dtype. w: [E, I, O] array, or a
    QuantizedWeight of that shape (frozen; no gradient)."""
    if lay.method == "ragged":
        full = w.dequantize(x.dtype) if isinstance(w, QuantizedWeight) else w.astype(x.dtype)
        return lax.ragged_dot(x, full, lay.sizes, preferred_element_type=_F32).astype(x.dtype)
    if isinstance(w, QuantizedWeight):
        spec = (w.kind, w.shape[-1])
        parts = (lax.stop_gradient(w.codes[...]), lax.stop_gradient(w.scales[...]))
        return _tiled_frozen(x, parts, _plan(lay), lay.tile, spec)
    return _tiled(x, w.astype(x.dtype), _plan(lay), lay.tile)


def _plan(lay: Layout) -> tuple[jax.Array, ...]:
    """The integer arrays the tile loops read: (first tile [E], tiles [E], active [E],
    number active [])."""
    return lay.first_tile, lay.sizes // lay.tile, lay.active, lay.num_active


def _expert(parts, e: jax.Array, spec, dtype) -> jax.Array:
    """Expert e's [I, O] matrix from the stacked storage."""
    if spec is None:
        return lax.dynamic_index_in_dim(parts, e, keepdims=False)
    codes, scales = (lax.dynamic_index_in_dim(a, e, keepdims=False) for a in parts)
    return dequantize_codes(codes, scales, spec[0], spec[1], dtype)


def _experts_loop(plan, body, init):
    """For each expert with rows (ascending): carry = body(e, first tile, end tile, carry)."""
    first, count, active, num_active = plan

    def outer(j, carry):
        e = active[j]
        return body(e, first[e], first[e] + count[e], carry)

    return lax.fori_loop(0, num_active, outer, init)


def _loop(x, parts, plan, tile, spec, out_width, transpose):
    """Each tile's rows of x [R, I] times its expert's matrix (transposed: x [R, O] @ w_e^T)
    -> [R, out_width]. The expert's matrix is sliced (or dequantized) once for all its tiles."""
    rows = x.shape[0]
    dims = (((1,), (1 if transpose else 0,)), ((), ()))

    def expert(e, lo, hi, out):
        wt = _expert(parts, e, spec, x.dtype)  # [I, O]

        def tile_body(i, out):
            xt = lax.dynamic_slice_in_dim(x, i * tile, tile)  # [T, I] (or [T, O])
            yt = lax.dot_general(xt, wt, dims, preferred_element_type=_F32)
            return lax.dynamic_update_slice_in_dim(out, yt.astype(x.dtype), i * tile, 0)

        return lax.fori_loop(lo, hi, tile_body, out)

    return _experts_loop(plan, expert, jnp.zeros((rows, out_width), x.dtype))


def _weight_grad(x, g, plan, tile, experts):
    """Each expert's sum over its tiles of x_tile^T @ g_tile: [E, I, O] float32 (zero for
    experts without rows)."""

    def expert(e, lo, hi, dw):
        def tile_body(i, acc):
            xt = lax.dynamic_slice_in_dim(x, i * tile, tile)  # [T, I]
            gt = lax.dynamic_slice_in_dim(g, i * tile, tile)  # [T, O]
            return acc + lax.dot_general(xt, gt, (((0,), (0,)), ((), ())),
                                         preferred_element_type=_F32)  # [I, O]

        acc = lax.fori_loop(lo, hi, tile_body, jnp.zeros((x.shape[1], g.shape[1]), _F32))
        return lax.dynamic_update_index_in_dim(dw, acc, e, 0)

    return _experts_loop(plan, expert, jnp.zeros((experts, x.shape[1], g.shape[1]), _F32))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _tiled(x, w, plan, tile):
    return _loop(x, w, plan, tile, None, w.shape[2], False)


def _tiled_fwd(x, w, plan, tile):
    return _tiled(x, w, plan, tile), (x, w, plan)


def _tiled_bwd(tile, residuals, g):
    x, w, plan = residuals
    g = g.astype(x.dtype)
    dx = _loop(g, w, plan, tile, None, w.shape[1], True)  # [R, I]
    dw = _weight_grad(x, g, plan, tile, w.shape[0]).astype(w.dtype)
    return dx, dw, (None,) * len(plan)


_tiled.defvjp(_tiled_fwd, _tiled_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4))
def _tiled_frozen(x, parts, plan, tile, spec):
    return _loop(x, parts, plan, tile, spec, spec[1], False)


def _tiled_frozen_fwd(x, parts, plan, tile, spec):
    return _tiled_frozen(x, parts, plan, tile, spec), (parts, plan)


def _tiled_frozen_bwd(tile, spec, residuals, g):
    parts, plan = residuals
    dx = _loop(g, parts, plan, tile, spec, parts[0].shape[1], True)  # [R, I]
    return dx, (None,) * len(parts), (None,) * len(plan)


_tiled_frozen.defvjp(_tiled_frozen_fwd, _tiled_frozen_bwd)
