"""The SigLIP-style vision tower that vision-language families share: patches -> features.

Design choices:
- The tower is the ViT alone: a patch embedding (a convolution whose kernel equals its stride,
  written as a reshape into patches and one product), learned position embeddings, pre-norm
  encoder blocks with bidirectional attention and biased projections, and a final LayerNorm.
  What a family does around it (which images, which positions, pooling, projection into the
  text model) lives in the family's file (hone/models/vision/idefics3.py).
- Positions are an input. A fixed-size SigLIP (Gemma 3) numbers its patches 0..P-1, the
  default. Idefics3 / SmolVLM (NaViT-style) maps each patch's fractional coordinate inside the
  image's real area onto the grid of learned positions: `fractional_position_ids`, written to
  give transformers' numbers bit for bit (its bucket boundaries come from torch.arange, whose
  float32 values are not the nearest floats of k/n; see `bucket_boundaries`).
- Padding patches are masked as keys only: every query row still attends to the image's real
  patches, as transformers' bidirectional mask does, so no row is all masked.
- Projections are hone's `Linear` (so LoRA and quantized storage attach as on the text model)
  with the bias as a parameter of its own beside it, like the text attention's q/k/v biases.

Shape letters (beside hone/models/layers.py's): I images (the batch of the tower), C channels,
Y X pixel rows and columns, p the patch side, P patches per image (rows h times columns w),
E the tower's width, M its MLP width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.models.attention import dense_attention
from hone.models.layers import param
from hone.models.linear import Linear


@dataclass(frozen=True)
class VisionConfig:
    """Architecture of one SigLIP-style tower (field names follow transformers' vision configs)."""

    hidden_size: int = 32  # E, the tower's residual width
    intermediate_size: int = 64  # M, its MLP width
    num_layers: int = 2  # encoder blocks
    num_heads: int = 4  # attention heads (E // num_heads wide each)
    num_channels: int = 3  # C, colour channels of pixel_values
    image_size: int = 32  # the side, in pixels, the position table was trained for
    patch_size: int = 8  # p, the patch side in pixels (the convolution's kernel and stride)
    layer_norm_eps: float = 1e-6  # LayerNorm epsilon
    activation: str = "gelu_tanh"  # MLP nonlinearity: "gelu_tanh" (SigLIP) or "gelu" (erf)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patches_per_side(self) -> int:
        """Side of the learned position grid: the table has patches_per_side**2 rows."""
        return self.image_size // self.patch_size


class LayerNorm(nnx.Module):
    """y = (x - mean) / sqrt(var + eps) * scale + bias over the last axis, in float32."""

    def __init__(self, dim: int, eps: float, dtype):
        self.eps = eps
        self.scale = param(None, (dim,), ("embed",), dtype, "ones")
        self.bias = param(None, (dim,), ("embed",), dtype, "zeros")

    def __call__(self, x: jax.Array) -> jax.Array:
        x32 = x.astype(jnp.float32)
        mean = jnp.mean(x32, axis=-1, keepdims=True)
        var = jnp.mean(jnp.square(x32 - mean), axis=-1, keepdims=True)
        y = (x32 - mean) * jax.lax.rsqrt(var + self.eps)
        return (y * self.scale[...].astype(jnp.float32)
                + self.bias[...].astype(jnp.float32)).astype(x.dtype)


class VisionAttention(nnx.Module):
    """Bidirectional multi-head attention with biased q, k, v and output projections."""

    def __init__(self, cfg: VisionConfig, dtype, rngs: nnx.Rngs):
        e, n, h = cfg.hidden_size, cfg.num_heads, cfg.head_dim
        if n * h != e:
            raise ValueError(f"vision hidden_size {e} is not a multiple of num_heads {n}")
        names = ("embed", "heads", "head_dim")
        self.q = Linear((e,), (n, h), names, dtype, rngs)
        self.k = Linear((e,), (n, h), names, dtype, rngs)
        self.v = Linear((e,), (n, h), names, dtype, rngs)
        self.o = Linear((n, h), (e,), ("heads", "head_dim", "embed"), dtype, rngs)
        self.q_bias = param(None, (n, h), ("heads", "head_dim"), dtype, "zeros")
        self.k_bias = param(None, (n, h), ("heads", "head_dim"), dtype, "zeros")
        self.v_bias = param(None, (n, h), ("heads", "head_dim"), dtype, "zeros")
        self.o_bias = param(None, (e,), ("embed",), dtype, "zeros")
        self.scale = h ** -0.5

    def __call__(self, x: jax.Array, key_valid: jax.Array) -> jax.Array:
        """x [I, P, E], key_valid [I, P] (False: a padding patch no query looks at)."""
        q = self.q(x) + self.q_bias[...]  # [I, P, N, H]
        k = self.k(x) + self.k_bias[...]
        v = self.v(x) + self.v_bias[...]
        p = x.shape[1]
        mask = jnp.broadcast_to(key_valid[:, None, :], (x.shape[0], p, p))  # [I, P(query), P(key)]
        out, _ = dense_attention(q, k, v, mask, scale=self.scale)  # [I, P, N, H]
        return self.o(out) + self.o_bias[...]


class VisionMLP(nnx.Module):
    """fc2(act(fc1(x))), both biased."""

    def __init__(self, cfg: VisionConfig, dtype, rngs: nnx.Rngs):
        e, m = cfg.hidden_size, cfg.intermediate_size
        self.fc1 = Linear((e,), (m,), ("embed", "mlp"), dtype, rngs)
        self.fc1_bias = param(None, (m,), ("mlp",), dtype, "zeros")
        self.fc2 = Linear((m,), (e,), ("mlp", "embed"), dtype, rngs)
        self.fc2_bias = param(None, (e,), ("embed",), dtype, "zeros")
        self.approximate = cfg.activation == "gelu_tanh"

    def __call__(self, x: jax.Array) -> jax.Array:  # [I, P, E] -> [I, P, E]
        h = jax.nn.gelu(self.fc1(x) + self.fc1_bias[...], approximate=self.approximate)
        return self.fc2(h) + self.fc2_bias[...]


class EncoderBlock(nnx.Module):
    """Pre-norm residual block: x + attn(norm1(x)), then + mlp(norm2(x))."""

    def __init__(self, cfg: VisionConfig, dtype, rngs: nnx.Rngs):
        self.attn_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype)
        self.attn = VisionAttention(cfg, dtype, rngs)
        self.mlp_norm = LayerNorm(cfg.hidden_size, cfg.layer_norm_eps, dtype)
        self.mlp = VisionMLP(cfg, dtype, rngs)

    def __call__(self, x: jax.Array, key_valid: jax.Array) -> jax.Array:
        x = x + self.attn(self.attn_norm(x), key_valid)
        return x + self.mlp(self.mlp_norm(x))


class VisionTower(nnx.Module):
    """pixels [I, C, Y, X] -> post-normed patch features [I, P, E], P = (Y // p) * (X // p)."""

    def __init__(self, cfg: VisionConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = cfg
        c, p, e = cfg.num_channels, cfg.patch_size, cfg.hidden_size
        # The patch convolution as one product over each patch's (C, p, p) pixels.
        self.patch = Linear((c, p, p), (e,), (None, None, None, "embed"), dtype, rngs)
        self.patch_bias = param(None, (e,), ("embed",), dtype, "zeros")
        self.position = param(rngs, (cfg.patches_per_side ** 2, e), (None, "embed"), dtype)
        self.layers = nnx.List([EncoderBlock(cfg, dtype, rngs) for _ in range(cfg.num_layers)])
        self.post_norm = LayerNorm(e, cfg.layer_norm_eps, dtype)

    def embed(self, pixels: jax.Array, position_ids: jax.Array | None = None) -> jax.Array:
        """Patch embeddings plus position embeddings [I, P, E]; position_ids [I, P] index the
        learned table (default 0..P-1, a fixed-size tower)."""
        i, c, y, x = pixels.shape
        p = self.config.patch_size
        h, w = y // p, x // p
        patches = pixels.reshape(i, c, h, p, w, p).transpose(0, 2, 4, 1, 3, 5)  # [I, h, w, C, p, p]
        emb = self.patch(patches.reshape(i, h * w, c, p, p)) + self.patch_bias[...]  # [I, P, E]
        if position_ids is None:
            position_ids = jnp.broadcast_to(jnp.arange(h * w, dtype=jnp.int32), (i, h * w))
        return emb + jnp.take(self.position[...], position_ids, axis=0)

    def __call__(self, pixels: jax.Array, patch_valid: jax.Array | None = None,
                 position_ids: jax.Array | None = None) -> jax.Array:
        """pixels [I, C, Y, X]; patch_valid [I, h, w] (True: the patch holds image, False:
        padding, which keys ignore); position_ids [I, P]."""
        x = self.embed(pixels.astype(self.patch.kernel.dtype), position_ids)
        i, p = x.shape[:2]
        key_valid = (jnp.ones((i, p), jnp.bool_) if patch_valid is None
                     else patch_valid.reshape(i, p).astype(jnp.bool_))
        for layer in self.layers:
            x = layer(x, key_valid)
        return self.post_norm(x)


def bucket_boundaries(n: int) -> np.ndarray:
    """float32 `torch.arange(1/n, 1.0, 1/n)` as PyTorch's CPU kernel computes it: in double,
    start + step * i for the scalar tail, but in vectors of 8 floats two at a time, each
    vector's base rounded to float32 before its lanes add j * step in double. (So 12/19 comes
    out as 0.631579, not the nearest float 0.6315789; a full 27-patch side of SmolVLM2 lands on
    such a boundary.) Checked against torch for every n below 300 (test_idefics3.py)."""
    step = 1.0 / n
    count = max(int(math.ceil((1.0 - step) / step)), 0)
    out = np.empty(count, np.float32)
    lanes, unroll = 8, 2
    i = 0
    while i + lanes * unroll <= count:
        for _ in range(unroll):
            base = np.float64(np.float32(step + step * i))
            out[i:i + lanes] = (base + np.arange(lanes, dtype=np.float64) * step).astype(np.float32)
            i += lanes
    for k in range(i, count):
        out[k] = np.float32(step + step * k)
    return out


def fractional_position_ids(patch_valid: jax.Array, patches_per_side: int) -> jax.Array:
    """Idefics2/3 (NaViT-style) position ids [I, h*w] of images whose real area is the top-left
    block of valid patches in patch_valid [I, h, w]: the real area's patch (r, c) takes the
    learned position of the grid cell holding its fractional coordinate (r / rows, c / cols);
    padding patches take position 0. Float32 arithmetic as transformers' (see module doc)."""
    i, h, w = patch_valid.shape
    boundaries = jnp.asarray(bucket_boundaries(patches_per_side))
    rows = patch_valid[:, :, 0].sum(axis=1).astype(jnp.float32)  # [I] real patch rows
    cols = patch_valid[:, 0, :].sum(axis=1).astype(jnp.float32)  # [I] real patch columns
    top = np.float32(1.0 - 1e-6)

    def buckets(count, length):  # [I] -> [I, length]
        coords = jnp.arange(length, dtype=jnp.float32)[None, :] * (1.0 / count)[:, None]
        return jnp.searchsorted(boundaries, jnp.minimum(coords, top), side="right")

    ids = buckets(rows, h)[:, :, None] * patches_per_side + buckets(cols, w)[:, None, :]
    return jnp.where(patch_valid, ids, 0).reshape(i, h * w).astype(jnp.int32)
