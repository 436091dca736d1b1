"""Grouped matrix products: rows sorted by expert, each expert's rows times that expert's matrix.

A routed MLP's N*k (token, expert) pairs are laid out once per call (`layout`): sorted by
expert, each expert's rows padded with zero rows up to a multiple of a row tile T. Every
product of the expert MLP then runs on that layout (`gmm`): y[rows of e] = x[rows of e] @ w[e]
for stacked w [E, I, O]. Two ways to compute it, chosen at trace time:

- "ragged": `jax.lax.ragged_dot` with one group per expert (T = 1, no padding). On GPU and TPU
  XLA implements it as a grouped matmul whose work follows the rows; XLA:CPU (jax 0.10.2)
  lowers it to a masked product over every expert (E times the work).
- "tiles" (the CPU default): a loop over the tiles in use, each one [T, I] x [I, O] product
  with its expert's matrix sliced out of the stack. Work is (N*k + at most E*(T-1) padding
  rows) x I x O, and each tile reads only its expert's weights. The backward pass is written
  out: dx with the same loop against w transposed, dw as a second loop that adds each tile's
  x^T @ dy into its expert's slot of an [E, I, O] buffer (a separate loop, so a frozen w,
  as under LoRA, costs nothing: nobody reads that loop's result and it is removed).

The static number of tiles is bounded by floor((N*k + E*(T-1)) / T): sum_e ceil(n_e / T)
cannot exceed it. The loop stops at the tiles actually used.

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
    source: jax.Array  # [R] token each row holds; N (out of range) for a padding row
    sizes: jax.Array  # [E] rows per expert, padded to the tile: ragged_dot's group sizes
    tile_expert: jax.Array  # [R / T] expert of each tile
    tiles: jax.Array  # [] tiles in use (the loop's trip count)
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
    source = jnp.full(rows, n, jnp.int32).at[dest].set(
        jnp.arange(p, dtype=jnp.int32) // k)  # [R]
    starts = jnp.arange(rows // tile, dtype=jnp.int32) * tile  # [R / T] first row of each tile
    tile_expert = jnp.minimum(jnp.searchsorted(ends, starts, side="right"),
                              experts - 1).astype(jnp.int32)  # [R / T]
    return Layout(dest, source, padded, tile_expert, ends[-1] // tile, tile, method)


def gather_rows(x: jax.Array, lay: Layout) -> jax.Array:
    """x [N, D] -> the layout's rows [R, D] (padding rows zero)."""
    return jnp.take(x, lay.source, axis=0, mode="fill", fill_value=0)


def scatter_rows(y: jax.Array, lay: Layout) -> jax.Array:
    """The layout's rows [R, D] -> each pair's row [P, D], pairs in (token, slot) order."""
    return jnp.take(y, lay.dest, axis=0)


def gmm(x: jax.Array, w, lay: Layout) -> jax.Array:
    """x [R, I] @ w[expert of the row] -> [R, O] in x's dtype. w: [E, I, O] array, or a
    QuantizedWeight of that shape (frozen; no gradient)."""
    if lay.method == "ragged":
        full = w.dequantize(x.dtype) if isinstance(w, QuantizedWeight) else w.astype(x.dtype)
        return lax.ragged_dot(x, full, lay.sizes, preferred_element_type=_F32).astype(x.dtype)
    if isinstance(w, QuantizedWeight):
        spec = (w.kind, w.shape[-1])
        parts = (lax.stop_gradient(w.codes[...]), lax.stop_gradient(w.scales[...]))
        return _tiled_frozen(x, parts, lay.tile_expert, lay.tiles, lay.tile, spec)
    return _tiled(x, w.astype(x.dtype), lay.tile_expert, lay.tiles, lay.tile)


def _expert(parts, e: jax.Array, spec, dtype) -> jax.Array:
    """Expert e's [I, O] matrix from the stacked storage."""
    if spec is None:
        return lax.dynamic_index_in_dim(parts, e, keepdims=False)
    codes, scales = (lax.dynamic_index_in_dim(a, e, keepdims=False) for a in parts)
    return dequantize_codes(codes, scales, spec[0], spec[1], dtype)


def _loop(x, parts, tile_expert, tiles, tile, spec, out_width, transpose):
    """Each tile's rows of x [R, I] times its expert's matrix (transposed: x [R, O] @ w_e^T)
    -> [R, out_width]."""
    rows = x.shape[0]

    def body(i, out):
        start = i * tile
        xt = lax.dynamic_slice_in_dim(x, start, tile)  # [T, I] (or [T, O])
        wt = _expert(parts, tile_expert[i], spec, x.dtype)  # [I, O]
        dims = (((1,), (1 if transpose else 0,)), ((), ()))
        yt = lax.dot_general(xt, wt, dims, preferred_element_type=_F32)
        return lax.dynamic_update_slice_in_dim(out, yt.astype(x.dtype), start, 0)

    return lax.fori_loop(0, tiles, body, jnp.zeros((rows, out_width), x.dtype))


def _weight_grad(x, g, tile_expert, tiles, tile, experts):
    """sum over tiles of x_tile^T @ g_tile into its expert's slot: [E, I, O] float32."""

    def body(i, dw):
        start, e = i * tile, tile_expert[i]
        xt = lax.dynamic_slice_in_dim(x, start, tile)  # [T, I]
        gt = lax.dynamic_slice_in_dim(g, start, tile)  # [T, O]
        upd = lax.dot_general(xt, gt, (((0,), (0,)), ((), ())),
                              preferred_element_type=_F32)  # [I, O]
        cur = lax.dynamic_index_in_dim(dw, e, keepdims=False)
        return lax.dynamic_update_index_in_dim(dw, cur + upd, e, 0)

    zeros = jnp.zeros((experts, x.shape[1], g.shape[1]), _F32)
    return lax.fori_loop(0, tiles, body, zeros)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _tiled(x, w, tile_expert, tiles, tile):
    return _loop(x, w, tile_expert, tiles, tile, None, w.shape[2], False)


def _tiled_fwd(x, w, tile_expert, tiles, tile):
    return _tiled(x, w, tile_expert, tiles, tile), (x, w, tile_expert, tiles)


def _tiled_bwd(tile, residuals, g):
    x, w, tile_expert, tiles = residuals
    g = g.astype(x.dtype)
    dx = _loop(g, w, tile_expert, tiles, tile, None, w.shape[1], True)  # [R, I]
    dw = _weight_grad(x, g, tile_expert, tiles, tile, w.shape[0]).astype(w.dtype)
    return dx, dw, None, None


_tiled.defvjp(_tiled_fwd, _tiled_bwd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def _tiled_frozen(x, parts, tile_expert, tiles, tile, spec):
    return _loop(x, parts, tile_expert, tiles, tile, spec, spec[1], False)


def _tiled_frozen_fwd(x, parts, tile_expert, tiles, tile, spec):
    return _tiled_frozen(x, parts, tile_expert, tiles, tile, spec), (parts, tile_expert, tiles)


def _tiled_frozen_bwd(tile, spec, residuals, g):
    parts, tile_expert, tiles = residuals
    in_width = parts[0].shape[1]
    dx = _loop(g, parts, tile_expert, tiles, tile, spec, in_width, True)  # [R, I]
    return dx, jax.tree.map(lambda _: None, parts), None, None


_tiled_frozen.defvjp(_tiled_frozen_fwd, _tiled_frozen_bwd)
