"""The model's matrix products, with float32 accumulation whenever the inputs are bfloat16.

`matmul(x, w)` is x[..., K] @ w[K, N]. In float32 its forward product is a plain `jnp.dot`, and
its backward pass is written out so that the weight gradient reads x^T copied row-major and the
cotangent as it is (left to autodiff, XLA:CPU transposed the cotangent, often fused with the
activation's derivative into a strided copy: the SmolLM2 SFT step went 3.2-3.3 -> 3.0-3.1 s and
its XLA compilation 8 -> 6-7 s with this). With bfloat16 inputs
(the "bf16" compute policy, or a bfloat16 model) all three products of a training step, the
forward one and the two of the backward pass, run as bfloat16 x bfloat16 with float32
accumulation, rounded to bfloat16 once at the end. That is the fast path of XLA:CPU (about 1.8x
float32 on this machine's AVX-512 BF16; a plain bfloat16 dot, or the float32-cotangent dot that
autodiff of `preferred_element_type=float32` produces, is no faster than float32), and it is
also the more accurate one: a long contraction is summed in float32, not in bfloat16.

`out_dtype` (default: the inputs' dtype) sets what the forward product returns; the LM head asks
for float32 logits straight from the accumulator. The cotangent arriving in the backward pass is
rounded to the inputs' dtype first (standard mixed precision: gradients flow in the compute
dtype), and the weight gradient comes back in w's dtype, to be cast up to the float32 master
weight by the policy's cast.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

_F32 = jnp.float32


def matmul(x: jax.Array, w: jax.Array, out_dtype=None) -> jax.Array:
    """x[..., K] @ w[K, N] -> [..., N]; bfloat16 inputs accumulate in float32 (module doc)."""
    if x.dtype != w.dtype or x.dtype not in (jnp.float32, jnp.bfloat16):
        y = jnp.dot(x, w)
        return y if out_dtype is None else y.astype(out_dtype)
    # Both float32 or both bfloat16: the written-out backward pass (for float32 inputs every
    # cast in it is a no-op, so the products are plain float32 dots).
    lead = x.shape[:-1]
    y = _mixed(x.reshape(-1, x.shape[-1]), w, jnp.dtype(out_dtype or x.dtype))
    return y.reshape(lead + (w.shape[1],))


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _mixed(x: jax.Array, w: jax.Array, out_dtype) -> jax.Array:
    return lax.dot(x, w, preferred_element_type=_F32).astype(out_dtype)


def _mixed_fwd(x, w, out_dtype):
    return _mixed(x, w, out_dtype), (x, w)


_BY_ROWS = (((1,), (1,)), ((), ()))  # dot_general numbers contracting both last axes: u @ v^T


def _row_major(a: jax.Array) -> jax.Array:
    """`a` laid out row-major in memory. XLA folds a transpose into the dot that reads it (as
    a transposed operand) or into the array's layout; going through a flat 1-D array behind an
    optimization barrier makes it a real, contiguous copy."""
    return lax.optimization_barrier(a.reshape(-1)).reshape(a.shape)


def _mixed_bwd(out_dtype, residuals, g):
    x, w = residuals
    g = g.astype(x.dtype)
    # dx = g @ w^T reads w transposed, which the fast kernel accepts. dw = x^T @ g would read x
    # transposed as the left operand, which it does not (XLA:CPU falls back to converting both
    # to float32, 1.5-2.4x slower on this model's shapes), so x^T is copied first (M x K
    # bfloat16: far cheaper than the product).
    dx = lax.dot_general(g, w, _BY_ROWS, preferred_element_type=_F32)
    dw = lax.dot(_row_major(x.T), g, preferred_element_type=_F32)
    return dx.astype(x.dtype), dw.astype(w.dtype)


_mixed.defvjp(_mixed_fwd, _mixed_bwd)


def low_rank(x: jax.Array, a: jax.Array, b: jax.Array, scale: float) -> jax.Array:
    """(x[M, I] @ a[I, r] * scale) @ b[r, O] -> [M, O], r small (a LoRA update), in the
    inputs' common dtype.

    The backward pass is written out so that only the small [M, r] operands are ever laid out
    transposed: left to autodiff, XLA:CPU transposed the [M, O] cotangent (or x) for the two
    adapter gradients, a strided copy that cost more than the adapters' products (on the
    SmolLM2 LoRA step, 15 ms per MLP projection). Here dB = h^T @ g and dA = (dh^T @ x)^T read
    g and x as they are, after copying h^T and dh^T ([r, M]) row-major.
    """
    dt = jnp.result_type(x, a, b)
    lead = x.shape[:-1]
    y = _low_rank(x.reshape(-1, x.shape[-1]).astype(dt), a.astype(dt), b.astype(dt),
                  float(scale))
    return y.reshape(lead + (b.shape[1],))


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _low_rank(x, a, b, scale):
    return _low_rank_fwd(x, a, b, scale)[0]


def _low_rank_fwd(x, a, b, scale):
    h = (lax.dot(x, a) * scale).astype(x.dtype)
    return lax.dot(h, b), (x, a, b, h)


def _low_rank_bwd(scale, residuals, g):
    # Products in the inputs' dtype (XLA:CPU has no bfloat16 x bfloat16 -> float32 kernel for
    # these rank-r shapes; its bfloat16 dot accumulates in float32 inside and rounds once).
    x, a, b, h = residuals
    g = g.astype(x.dtype)
    dh = lax.dot_general(g, b, _BY_ROWS)  # [M, r]
    db = lax.dot(_row_major(h.T), g)  # [r, O]
    dh = (dh * scale).astype(x.dtype)
    da = lax.dot(_row_major(dh.T), x).T  # [I, r]
    dx = lax.dot_general(dh, a, _BY_ROWS)  # [M, I]
    return dx, da, db


_low_rank.defvjp(_low_rank_fwd, _low_rank_bwd)

