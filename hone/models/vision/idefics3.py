"""Idefics3 / SmolVLM: a SigLIP-style tower, a pixel-shuffle connector and hone's one transformer.

Design choices:
- The language model is hone's Transformer (a Llama here), unchanged: the images only change
  the embeddings it starts from (`Transformer.hidden(..., embeds=)`). So `model(input_ids)`
  without images is the text model's forward pass exactly, and everything the trainer sets on
  the text model (remat, attention path, head chunks) lives on `model.text`.
- Inputs are transformers' (Idefics3ForConditionalGeneration's): pixel_values [B, I, C, Y, X]
  with all-zero padding images where a record has fewer than I, pixel_attention_mask
  [B, I, Y, X] with 1 on each image's real pixels (the top-left block; the rest is padding).
- Every image slot goes through the tower, padding slots too (a fixed shape, so one compiled
  program per batch shape); the features of the real images, in order, fill the `<image>`
  placeholders in order, as transformers' masked_scatter does. Padding slots get an all-valid
  patch mask so no attention row is degenerate, and their features are never read.
- When the inputs are concrete (not traced), the placeholder counts are checked per row against
  the row's real images before anything runs, with transformers' words ("Image features and
  image tokens do not match") and the row named; under jit the check cannot run.

Shape letters (beside hone/models/layers.py's and siglip.py's): I image slots per record,
Q text-width features per image (P / s**2 for pixel-shuffle scale s).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.config import ModelConfig
from hone.models.linear import Linear
from hone.models.transformer import Transformer
from hone.models.vision.siglip import VisionConfig, VisionTower, fractional_position_ids


@dataclass(frozen=True)
class Idefics3Config:
    """The vision tower, the connector's scale and the text model of an Idefics3 / SmolVLM."""

    vision: VisionConfig = field(default_factory=VisionConfig)  # the SigLIP-style tower
    text: ModelConfig = field(default_factory=ModelConfig)  # the language model (Llama family)
    scale_factor: int = 2  # pixel shuffle: s x s neighbouring patches become one token
    image_token_id: int = 128257  # the `<image>` placeholder each image feature replaces


def pixel_shuffle(x: jax.Array, s: int) -> jax.Array:
    """[I, P, E] -> [I, P / s**2, E * s**2]: each s x s block of the (square) patch grid becomes
    one vector, in transformers' order (s columns, then s rows of those)."""
    i, p, e = x.shape
    side = math.isqrt(p)
    if side * side != p or side % s:
        raise ValueError(f"pixel shuffle needs a square grid of patches whose side divides by "
                         f"{s}; got {p} patches")
    x = x.reshape(i, side, side // s, e * s)  # [I, rows, cols/s, s*E]
    x = x.transpose(0, 2, 1, 3).reshape(i, side // s, side // s, e * s * s)
    return x.transpose(0, 2, 1, 3).reshape(i, p // (s * s), e * s * s)


class Connector(nnx.Module):
    """Patch features [I, P, E] -> text-width image features [I, Q, D]: pixel shuffle, then a
    linear projection without bias (transformers' `modality_projection`)."""

    def __init__(self, cfg: Idefics3Config, dtype, rngs: nnx.Rngs):
        self.scale_factor = cfg.scale_factor
        width = cfg.vision.hidden_size * cfg.scale_factor ** 2
        self.proj = Linear((width,), (cfg.text.hidden_size,), (None, "embed"), dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(pixel_shuffle(x, self.scale_factor))


class Idefics3(nnx.Module):
    """(input_ids [B, T], pixel_values [B, I, C, Y, X], ...) -> logits [B, T, V] (float32)."""

    def __init__(self, cfg: Idefics3Config, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = cfg
        self.vision = VisionTower(cfg.vision, dtype=dtype, rngs=rngs)
        self.connector = Connector(cfg, dtype, rngs)
        self.text = Transformer(cfg.text, dtype=dtype, rngs=rngs)

    def image_features(self, pixel_values, pixel_attention_mask=None):
        """(features [B*I, Q, D] of every image slot, real [B, I]: the slot holds an image,
        not all-zero padding). pixel_values [B, I, C, Y, X]; pixel_attention_mask [B, I, Y, X]
        (default: every pixel real)."""
        pixels = jnp.asarray(pixel_values)
        b, i, c, y, x = pixels.shape
        pixels = pixels.reshape(b * i, c, y, x)
        real = real_images(pixels)  # [B*I]
        p = self.config.vision.patch_size
        if pixel_attention_mask is None:
            patch_valid = jnp.ones((b * i, y // p, x // p), jnp.bool_)
        else:  # a patch is real when any of its pixels is
            mask = jnp.asarray(pixel_attention_mask).reshape(b * i, y // p, p, x // p, p)
            patch_valid = jnp.any(mask != 0, axis=(2, 4))  # [B*I, h, w]
        # Padding slots: all valid, so their (unread) attention rows are ordinary.
        patch_valid = patch_valid | ~real[:, None, None]
        positions = fractional_position_ids(patch_valid, self.config.vision.patches_per_side)
        features = self.connector(self.vision(pixels, patch_valid, positions))  # [B*I, Q, D]
        return features, real.reshape(b, i)

    def embed(self, input_ids, pixel_values=None, pixel_attention_mask=None) -> jax.Array:
        """The text model's input embeddings [B, T, D], image features in place of the
        `<image>` placeholders when pixel_values are given."""
        tokens = jnp.asarray(input_ids)
        embeds = self.text.embedder.encode(tokens)
        if pixel_values is None:
            return embeds
        placeholder = tokens == self.config.image_token_id  # [B, T]
        self.check_images(tokens, pixel_values)  # before the tower runs: a bad batch fails at once
        features, real = self.image_features(pixel_values, pixel_attention_mask)
        return scatter_images(embeds, placeholder, features, real)

    def check_images(self, input_ids, pixel_values) -> None:
        """Raise InputError where a row's `<image>` count is not its real images' features
        (check_image_tokens); concrete inputs only, traced ones pass unchecked. The sampler
        calls it before its jitted `embed`, inside which the check cannot run."""
        check_image_tokens(jnp.asarray(input_ids) == self.config.image_token_id,
                           real_images(pixel_values), self.tokens_per_image(pixel_values),
                           self.config.image_token_id)

    def tokens_per_image(self, pixel_values) -> int:
        """Q, the placeholders one image of pixel_values [B, I, C, Y, X] fills."""
        y, x = pixel_values.shape[-2:]
        p, s = self.config.vision.patch_size, self.config.scale_factor
        return (y // p) * (x // p) // (s * s)

    def hidden(self, input_ids, positions=None, attention_mask=None, segment_ids=None, *,
               pixel_values=None, pixel_attention_mask=None, branch_ids=None) -> jax.Array:
        """Final-normed hidden states [B, T, D] (arguments as `__call__`)."""
        embeds = (None if pixel_values is None else
                  self.embed(input_ids, pixel_values, pixel_attention_mask))
        return self.text.hidden(jnp.asarray(input_ids), positions, attention_mask, segment_ids,
                                branch_ids=branch_ids, embeds=embeds)

    @property
    def head_chunk(self) -> int:
        """The text model's LM-head chunk (what the trainer set there; hone.train.scoring)."""
        return self.text.head_chunk

    def logits_from_hidden(self, hidden: jax.Array) -> jax.Array:
        """The text model's LM head on hidden states [..., D] -> float32 logits [..., V]."""
        return self.text.logits_from_hidden(hidden)

    def __call__(self, input_ids, positions=None, attention_mask=None, segment_ids=None, *,
                 pixel_values=None, pixel_attention_mask=None, branch_ids=None) -> jax.Array:
        """Logits [B, T, V]. The text arguments are the Transformer's (positions default to the
        count of real tokens before each one); pixel_values [B, I, C, Y, X] and
        pixel_attention_mask [B, I, Y, X] as transformers' Idefics3 processor returns them."""
        return self.text.logits_from_hidden(self.hidden(
            input_ids, positions, attention_mask, segment_ids, pixel_values=pixel_values,
            pixel_attention_mask=pixel_attention_mask, branch_ids=branch_ids))


def real_images(pixel_values):
    """[..., C, Y, X] -> [...]: True where the slot holds an image, False for the all-zero
    padding images (transformers' rule); numpy in, numpy out, so checks stay on the host."""
    xp = np if isinstance(pixel_values, np.ndarray) else jnp
    return xp.any(pixel_values != 0, axis=(-3, -2, -1))


def scatter_images(embeds: jax.Array, placeholder: jax.Array, features: jax.Array,
                   real: jax.Array) -> jax.Array:
    """embeds [B, T, D] with the k-th placeholder (row-major over [B, T]) replaced by feature
    row k of the real images' features laid end to end (transformers' masked_scatter), written
    as a gather so it traces with fixed shapes. features [B*I, Q, D], real [B, I]."""
    b, t, d = embeds.shape
    slots, q = features.shape[:2]
    rank = jnp.cumsum(placeholder.reshape(-1)) - 1  # [B*T] placeholder index, -1 before the first
    order = jnp.nonzero(real.reshape(-1), size=slots, fill_value=0)[0]  # real slots in order
    image = order[jnp.clip(rank // q, 0, slots - 1)]  # [B*T]
    picked = features[image, jnp.clip(rank % q, 0, q - 1)].astype(embeds.dtype)  # [B*T, D]
    return jnp.where(placeholder[..., None], picked.reshape(b, t, d), embeds)


def check_image_tokens(placeholder, real, per_image: int, image_token_id: int) -> None:
    """Each row's `<image>` count must be its real images times `per_image` (what truncation
    through an image breaks). Runs on concrete inputs only; traced ones pass unchecked."""
    if isinstance(placeholder, jax.core.Tracer) or isinstance(real, jax.core.Tracer):
        return
    tokens = np.asarray(placeholder).sum(axis=1)
    images = np.asarray(real).sum(axis=1)
    for row, (n, k) in enumerate(zip(tokens.tolist(), images.tolist())):
        if n != k * per_image:
            raise InputError(
                f"Image features and image tokens do not match: row {row} has {n} image tokens "
                f"(id {image_token_id}) but {k} image{'s' if k != 1 else ''} of {per_image} "
                f"features each ({k * per_image}); a prompt cut through an image, or images "
                "given to the wrong row?", key="input_ids")
