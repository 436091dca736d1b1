"""Quantized storage for a frozen base kernel (QLoRA): NF4 or int8 codes with block-wise scales.

Design choices:
- The kernel [*in, *out] is viewed as the 2-D matrix [I, O] its Linear multiplies by, and each
  row is cut into blocks of 64 consecutive output columns (O padded up to a multiple of 64 with
  zeros). That is the row-major flattened kernel in blocks of 64 whenever 64 divides O (true for
  every real model), and it keeps the storage 2-D, so the codes and scales carry the kernel's
  input and output axis names and shard like the kernel does.
- Each block stores absmax(block) as a float32 scale and every weight as a code of w / absmax:
  NF4 (4 bits, two codes packed per uint8 byte) or int8 (round(127 * w / absmax)). Bytes per
  weight: NF4 0.5 + 4/64 = 0.5625, int8 1 + 4/64 = 1.0625. Double-quantising the scales would
  save another 0.06 for NF4; not needed at this size.
- The codes live in `QuantizedKernel` variables, not `nnx.Param`: no filter for parameters
  (training, optimizer state, `hf_tensors`) ever sees them.
- Dequantization happens inside the projection (`Linear.__call__`), to the kernel's original
  dtype, right before the matmul, so XLA can fuse the unpacking into the product's operand.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

BLOCK = 64  # weights per absmax scale

# NormalFloat-4: the 16 levels that split a standard normal into equally likely bins, mapped to
# [-1, 1]: 8 positive levels at quantiles of the upper half, 7 negative at quantiles of the
# lower half (an asymmetric split so that 0 is represented exactly), each side normalised so its
# extreme level is +-1. Normally distributed weights divided by their block absmax then use every
# code about equally often.
NF4_LEVELS = np.array([
    -1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453,
    -0.28444138169288635, -0.18477343022823334, -0.09105003625154495, 0.0,
    0.07958029955625534, 0.16093020141124725, 0.24611230194568634, 0.33791524171829224,
    0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0], dtype=np.float32)

KINDS = ("nf4", "int8")


class QuantizedKernel(nnx.Variable):
    """Frozen quantized storage (codes or scales): never a parameter, never trained."""


def _blocks(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """[I, O] -> blocks [I, O_pad / 64, 64] (zero padded) and their absmax [I, O_pad / 64]."""
    i, o = w.shape
    pad = -o % BLOCK
    w = jnp.pad(w.astype(jnp.float32), ((0, 0), (0, pad)))
    blocks = w.reshape(i, -1, BLOCK)
    return blocks, jnp.max(jnp.abs(blocks), axis=-1)


@jax.jit
def _quantize_nf4(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    blocks, absmax = _blocks(w)
    unit = blocks / jnp.where(absmax == 0, 1.0, absmax)[..., None]  # in [-1, 1]
    # Nearest level: count the midpoints between consecutive levels that lie below the value.
    mids = jnp.asarray((NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2)
    codes = jnp.searchsorted(mids, unit.reshape(unit.shape[0], -1)).astype(jnp.uint8)
    packed = (codes[:, 0::2] << 4) | codes[:, 1::2]  # [I, O_pad / 2]: high nibble first
    return packed, absmax


@jax.jit
def _quantize_int8(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    blocks, absmax = _blocks(w)
    unit = blocks / jnp.where(absmax == 0, 1.0, absmax)[..., None]
    codes = jnp.clip(jnp.round(unit * 127), -127, 127).astype(jnp.int8)
    return codes.reshape(codes.shape[0], -1), absmax / 127


class QuantizedWeight(nnx.Module):
    """A kernel stored as codes [I, O_pad / 2] uint8 (nf4) or [I, O_pad] int8 plus float32
    scales [I, O_pad / 64]; `dequantize()` gives back the [I, O] matrix in the original dtype."""

    def __init__(self, kernel: jax.Array, kind: str, names: tuple[str, ...]):
        """kernel: the 2-D [I, O] weight, or a stack of them [E, I, O] (a routed MLP's experts,
        each expert's rows quantized as its own matrix's); names: logical axis names of its
        axes."""
        if kind not in KINDS:
            raise ValueError(f"unknown quantization {kind!r}; expected one of {KINDS}")
        self.kind = kind
        self.shape = tuple(kernel.shape)
        self.dtype = jnp.dtype(kernel.dtype)
        lead = self.shape[:-1]
        codes, scales = (_quantize_nf4 if kind == "nf4" else _quantize_int8)(
            kernel.reshape(-1, self.shape[-1]))
        codes, scales = codes.reshape(lead + (-1,)), scales.reshape(lead + (-1,))
        self.codes = QuantizedKernel(codes, out_sharding=names, eager_sharding=False)
        self.scales = QuantizedKernel(scales, out_sharding=names, eager_sharding=False)

    def dequantize(self, dtype=None) -> jax.Array:
        """The weight ([I, O], or [E, I, O]) in `dtype` (default: the dtype the kernel had)."""
        return dequantize_codes(self.codes[...], self.scales[...], self.kind, self.shape[-1],
                                dtype or self.dtype)

    @property
    def nbytes(self) -> int:
        """Bytes of codes and scales together."""
        return self.codes[...].nbytes + self.scales[...].nbytes

    @property
    def size(self) -> int:
        """Number of weights stored."""
        return math.prod(self.shape)


def dequantize_codes(codes: jax.Array, scales: jax.Array, kind: str, out_features: int,
                     dtype) -> jax.Array:
    """Codes [..., I, O_pad / 2] (nf4) or [..., I, O_pad] (int8) and scales [..., I, O_pad / 64]
    -> the weights [..., I, O] in `dtype`. Leading axes (a stack of experts, or one expert
    sliced out of it) carry through."""
    lead = codes.shape[:-1]  # [..., I]
    if kind == "nf4":
        codes = jnp.stack([codes >> 4, codes & 0xF], axis=-1).reshape(lead + (-1,))  # [..., O_pad]
        unit = jnp.asarray(NF4_LEVELS)[codes]
    else:
        unit = codes.astype(jnp.float32)
    w = unit.reshape(lead + (-1, BLOCK)) * scales[..., None]  # [..., I, O_pad / 64, 64]
    return w.reshape(lead + (-1,))[..., :out_features].astype(dtype)
