"""Linear: the one projection every weight matrix of the transformer goes through.

The kernel keeps its logical shape ([D, N, H] for q, [N, H, D] for o, [D, F] for the MLP), so
sharding rules see the head axes, but the product is always one plain 2-D matmul: XLA:CPU turned
the equivalent multi-axis einsums into a transpose of the kernel on every call (3x slower decode).
Having a single projection type is also what lets adapters (LoRA) and quantized storage attach to
every weight in one place.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from hone.models.layers import param


class Linear(nnx.Module):
    """y[..., *out] = x[..., *in] @ kernel[*in, *out]."""

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                 names: tuple[str, ...], dtype, rngs: nnx.Rngs):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        self.kernel = param(rngs, self.in_shape + self.out_shape, names, dtype)

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    @property
    def out_features(self) -> int:
        return math.prod(self.out_shape)

    def __call__(self, x: jax.Array) -> jax.Array:
        lead = x.shape[: x.ndim - len(self.in_shape)]
        x2 = x.reshape(lead + (self.in_features,))
        y = jnp.dot(x2, self.kernel[...].reshape(self.in_features, self.out_features))
        return y.reshape(lead + self.out_shape)
