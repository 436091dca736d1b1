"""Linear: the one projection every weight matrix of the transformer goes through.

The kernel keeps its logical shape ([D, N, H] for q, [N, H, D] for o, [D, F] for the MLP), so
sharding rules see the head axes, but the product is always one plain 2-D matmul: XLA:CPU turned
the equivalent multi-axis einsums into a transpose of the kernel on every call (3x slower decode).
Having a single projection type is also what lets adapters (LoRA) and quantized storage attach to
every weight in one place:
- `lora` (hone/models/lora.py): adds (dropout(x) @ A @ B) * alpha / r to the product;
- `quant` (hone/models/quant.py): replaces `kernel` by packed codes and scales, dequantized to
  the kernel's dtype right before the matmul.
- `packed` (hone/kernels/packed.py): the base weight laid out in column panels for the CPU decode
  kernel; the sampler attaches it inside its jitted decode step only (hone/sampling/engine.py).
Each is None on a plain model; lora.py and the sampler attach them, so this file imports neither
lora nor quant.
"""

from __future__ import annotations

import math
from typing import Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from hone.kernels import packed as packed_kernel
from hone.models.layers import param
from hone.models.matmul import matmul


# What Linear needs of its attachments, named here so that this file imports neither lora.py nor
# quant.py (lora.py imports this one): lora.LoRA and quant.QuantizedWeight fit these.
class Adapter(Protocol):
    def __call__(self, x: jax.Array) -> jax.Array:
        """The update added to the base product: x [..., in_features] -> [..., out_features]."""


class StoredWeight(Protocol):
    def dequantize(self) -> jax.Array:
        """The base weight as the [in_features, out_features] matrix that multiplies x."""


class Linear(nnx.Module):
    """y[..., *out] = x[..., *in] @ kernel[*in, *out] (+ the LoRA update, if attached)."""

    def __init__(self, in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                 names: tuple[str, ...], dtype, rngs: nnx.Rngs):
        self.in_shape, self.out_shape = tuple(in_shape), tuple(out_shape)
        self.names = tuple(names)  # logical axis names of the kernel, in then out
        self.kernel: nnx.Param | None = param(rngs, self.in_shape + self.out_shape, names, dtype)
        # Attached later by lora.py; nnx.data marks them as pytree data while still None.
        self.quant: StoredWeight | None = nnx.data(None)  # replaces kernel when quantized
        self.lora: Adapter | None = nnx.data(None)
        self.packed: jax.Array | None = nnx.data(None)  # set by the sampler's decode step only

    @property
    def in_features(self) -> int:
        return math.prod(self.in_shape)

    @property
    def out_features(self) -> int:
        return math.prod(self.out_shape)

    def weight(self) -> jax.Array:
        """The base kernel as the [in_features, out_features] matrix that multiplies x."""
        if self.quant is not None:
            return self.quant.dequantize()
        return self.kernel[...].reshape(self.in_features, self.out_features)

    def __call__(self, x: jax.Array) -> jax.Array:
        lead = x.shape[: x.ndim - len(self.in_shape)]
        x2 = x.reshape(lead + (self.in_features,))
        if self.packed is not None:
            y = packed_kernel.matmul(x2, self.packed, self.out_features).astype(x2.dtype)
        else:
            y = matmul(x2, self.weight())
        return self.finish(x2, y)

    def finish(self, x2: jax.Array, y: jax.Array) -> jax.Array:
        """The output from the base product y = x2 @ weight() [..., out_features]: plus the LoRA
        update, in the logical output shape. (Attention's fused q/k/v product calls it for each
        of its three parts.)"""
        if self.lora is not None:
            y = y + self.lora(x2).astype(y.dtype)
        return y.reshape(y.shape[:-1] + self.out_shape)
