"""Weights in column panels, and the CPU product that streams them (packed_matmul.cc).

`pack(w)` lays a [K, N] matrix out as [P, K, BW]: panel p holds columns p*BW .. p*BW + BW - 1
of every row, the last panel padded with zero columns. `matmul(x, panels, n)` is x[..., K] @ w
-> float32 [..., n], computed by the kernel: the same sums as `jnp.dot` in float32, in another
order (tests hold it to a float64 product at float32 rounding). `pack_pair(gate, up)` and
`gated(x, pairs, f, activation)` are the gated MLP's act(x @ gate) * (x @ up) in one call.

The sampler packs a model's weights once per set of weights and uses the panels for every decode
step (hone/sampling/engine.py): packing costs one copy of the weights, a decode step reads them
once.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from hone.kernels.compiler import library, panel_width


def usable(tree) -> bool:
    """Whether the kernels can run on these arrays: built here, the CPU backend, one device
    (a custom call has no sharding rule: on a mesh XLA would gather the weights first)."""
    if jax.default_backend() != "cpu" or library() is None:
        return False
    for leaf in jax.tree.leaves(tree):
        sharding = getattr(leaf, "sharding", None)
        if sharding is not None and len(sharding.device_set) > 1:
            return False
    return True


def pack(w: jax.Array) -> jax.Array:
    """[K, N] -> [ceil(N / BW), K, BW] column panels (zero columns pad the last)."""
    k, n = w.shape
    bw = panel_width()
    panels = -(-n // bw)
    if panels * bw != n:
        w = jnp.pad(w, ((0, 0), (0, panels * bw - n)))
    return w.reshape(k, panels, bw).transpose(1, 0, 2)


def pack_pair(gate: jax.Array, up: jax.Array) -> jax.Array:
    """Two [K, F] matrices -> [2 * ceil(F / BW), K, BW]: gate's panel p, then up's panel p."""
    a, b = pack(gate), pack(up)
    return jnp.stack([a, b], axis=1).reshape((2 * a.shape[0],) + a.shape[1:])


ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


def gated(x: jax.Array, pairs: jax.Array, f: int, activation: str) -> jax.Array:
    """act(x[..., K] @ gate) * (x @ up) -> float32 [..., f], the two matrices packed by
    `pack_pair`; activation "silu" or "gelu_tanh" (tanh-approximated gelu)."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = math.prod(lead)
    call = jax.ffi.ffi_call("hone_packed_gated", jax.ShapeDtypeStruct((rows, f), jnp.float32),
                            vmap_method="sequential")
    out = call(x.reshape(rows, k), pairs, activation=np.int32(ACTIVATIONS[activation]))
    return out.reshape(lead + (f,))


def matmul(x: jax.Array, panels: jax.Array, n: int) -> jax.Array:
    """x[..., K] @ (the matrix packed in panels [P, K, BW]) -> float32 [..., n]."""
    lead, k = x.shape[:-1], x.shape[-1]
    rows = math.prod(lead)
    call = jax.ffi.ffi_call("hone_packed_matmul", jax.ShapeDtypeStruct((rows, n), jnp.float32),
                            vmap_method="sequential")
    return call(x.reshape(rows, k), panels).reshape(lead + (n,))
