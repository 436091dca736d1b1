"""The single copy of the small layers every family shares: RMSNorm, embedder, rotary embeddings
and the helper that creates parameters with logical axis names (projections: linear.py, mlp.py).

Shape letters used across hone/models/:
  B batch, T query positions, S key positions, D hidden width, F MLP width, V vocabulary,
  N query heads, K key/value heads, G = N // K query heads per KV head, H head width.

Every parameter carries logical axis names (`embed`, `mlp`, `heads`, `kv_heads`, `head_dim`,
`vocab`) in its `out_sharding` metadata; only hone/parallel maps them to mesh axes.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.kernels import packed as packed_kernel
from hone.models.config import ModelConfig, RopeScaling
from hone.models.matmul import matmul


def param(rngs: nnx.Rngs | None, shape: tuple[int, ...], names: tuple[str, ...], dtype,
          init: str = "normal") -> nnx.Param:
    """A parameter with logical axis names. init: "normal" (std 0.02), "zeros" or "ones"."""
    assert len(shape) == len(names), (shape, names)
    if init == "zeros":
        value = jnp.zeros(shape, dtype)
    elif init == "ones":
        value = jnp.ones(shape, dtype)
    else:
        # The barrier keeps XLA from folding 0.02 into the sampler when init runs under jit
        # (sharded init), so jitted and eager init give the same bits.
        noise = jax.lax.optimization_barrier(jax.random.normal(rngs.params(), shape, jnp.float32))
        value = (0.02 * noise).astype(dtype)
    # eager_sharding=False: sharding is applied by hone/parallel from the names, not at creation.
    return nnx.Param(value, out_sharding=names, eager_sharding=False)


class RMSNorm(nnx.Module):
    """y = x / rms(x) * (offset + scale), computed in float32 whatever the input dtype."""

    def __init__(self, dim: int, eps: float, offset: float, dtype, name: str = "embed"):
        self.eps = eps
        self.offset = offset
        # Gemma stores (weight - 1) and multiplies by (1 + weight): start at zero there.
        self.scale = param(None, (dim,), (name,), dtype, "zeros" if offset else "ones")

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
        return (y * (self.offset + self.scale[...].astype(jnp.float32))).astype(x.dtype)


class Embedder(nnx.Module):
    """Token embedding [V, D]; also the output projection when embeddings are tied."""

    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        self.embedding = param(rngs, (cfg.vocab_size, cfg.hidden_size), ("vocab", "embed"), dtype)
        # Gemma scales embeddings by sqrt(D), rounded to the compute dtype as the reference does.
        self.scale = math.sqrt(cfg.hidden_size) if cfg.embed_scale else None
        # The table transposed into column panels for the CPU decode kernel; set by the
        # sampler's decode step only (hone/sampling/engine.py).
        self.packed: jax.Array | None = nnx.data(None)

    def encode(self, tokens: jax.Array) -> jax.Array:  # [B, T] -> [B, T, D]
        x = jnp.take(self.embedding[...], tokens, axis=0)
        if self.scale is not None:
            x = x * jnp.asarray(self.scale, x.dtype)
        return x

    def decode(self, x: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, V]
        table = self.embedding[...]
        if self.packed is not None:
            return packed_kernel.matmul(x, self.packed, table.shape[0])
        if x.dtype == table.dtype == jnp.bfloat16:  # float32 logits from the accumulator
            return matmul(x, table.T, out_dtype=jnp.float32)
        return jnp.einsum("BTD,VD->BTV", x, table)


def rope_inv_freq(head_dim: int, theta: float, scaling: RopeScaling | None) -> np.ndarray:
    """Inverse frequencies [H/2], float32, computed as the reference implementation does."""
    exponents = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv = (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)
    if scaling is None:
        return inv
    if scaling.kind == "linear":
        return (inv / np.float32(scaling.factor)).astype(np.float32)
    if scaling.kind == "llama3":
        # Long wavelengths are slowed by `factor`, short ones kept, the band between interpolated.
        old = scaling.original_max_position_embeddings
        low_wavelen = old / scaling.low_freq_factor
        high_wavelen = old / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / scaling.factor, inv)
        smooth = (old / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor)
        smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    raise ValueError(f"unknown rope scaling kind {scaling.kind!r}")


def positions_from_mask(valid):
    """Positions [B, T] (int32) of the real tokens of a [B, T] mask: 0, 1, ... counting only
    real tokens, so a left-padded prompt starts at 0 wherever it starts; slots before a row's
    first real token hold 0 (they attend to nothing). A numpy mask (host-side row packing)
    gives a numpy array, anything else a jax array: the same numbers either way."""
    xp = np if isinstance(valid, np.ndarray) else jnp
    return xp.maximum(xp.cumsum(xp.asarray(valid).astype(xp.int32), axis=1) - 1, 0).astype(
        xp.int32)


def rope_tables(positions: jax.Array, inv_freq: np.ndarray) -> tuple[jax.Array, jax.Array]:
    """cos and sin tables [B, T, H] for integer positions [B, T] (float32)."""
    freqs = positions.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)[None, None, :]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """Rotate [B, T, N, H] by position; the two halves of H form the (real, imaginary) pairs."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :].astype(x.dtype), sin[:, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin
