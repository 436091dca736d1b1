"""Gemma 3 vision-language (transformers' Gemma3ForConditionalGeneration): a SigLIP tower, an
average-pool projector, and hone's one transformer with bidirectional attention inside images.

Design choices:
- The tower is siglip.py's VisionTower with its default positions, 0..P-1 over the whole grid
  (a fixed-size SigLIP, no buckets): images must be the size the position table was trained
  for, image_size x image_size, which transformers' Gemma 3 processor resizes them to.
- The projector (Gemma3MultiModalProjector): the n x n patch features are averaged over k x k
  squares (k = n / sqrt(mm_tokens_per_image)), RMS-normed with Gemma's (1 + weight) convention
  (hone's RMSNorm with offset 1, the tower's epsilon) and multiplied by an [E, D] matrix without
  bias: mm_tokens_per_image soft tokens per image, row-major over the pooled grid.
- The language model is hone's Transformer with the gemma3_text flags, unchanged. Its embedder
  scales token embeddings by sqrt(D); the image features replace the placeholders' embeddings
  after that scaling and are not scaled themselves (transformers' masked_scatter into
  inputs_embeds). A placeholder id past the vocabulary reads row 0 (transformers replaces it by
  0 before the lookup), never an out-of-range row.
- Attention: the tokens of one image block (a run of consecutive token_type_ids == 1, what the
  processor marks on the placeholders) see each other both ways, on full and sliding layers;
  everything else is causal (`Transformer.hidden(..., bidirectional_ids=)`). Without
  token_type_ids every token is causal, as in transformers.
- Inputs are transformers': pixel_values [N, C, Y, X], every image of the batch in row order
  (the processor's layout: no padding slots, each image is real), token_type_ids [B, T].
  Image k fills placeholders k*Q .. (k+1)*Q - 1 counted row-major over the batch, as
  masked_scatter does, with idefics3.py's gather. On concrete inputs the counts are checked
  before the tower runs: each row's placeholders a whole number of images (what truncation
  through an image breaks), the batch's those of the N images.

Shape letters (beside hone/models/layers.py's and siglip.py's): N images of the batch, Q soft
tokens per image (mm_tokens_per_image), n the patch grid's side, k the pooling square's side.
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
from hone.models.layers import RMSNorm
from hone.models.linear import Linear
from hone.models.transformer import Transformer
from hone.models.vision.idefics3 import scatter_images
from hone.models.vision.siglip import VisionConfig, VisionTower


@dataclass(frozen=True)
class Gemma3VisionConfig:
    """The SigLIP tower, the projector's token count and the text model of a Gemma 3 VLM."""

    vision: VisionConfig = field(default_factory=VisionConfig)  # the SigLIP tower
    text: ModelConfig = field(default_factory=ModelConfig)  # the language model (gemma3_text)
    mm_tokens_per_image: int = 4  # Q, soft tokens per image (a square: 256 in the real models)
    image_token_id: int = 262144  # the `<image_soft_token>` placeholder each feature replaces

    @property
    def tokens_per_side(self) -> int:
        return math.isqrt(self.mm_tokens_per_image)

    @property
    def pool(self) -> int:
        """k: the side of the square of patches averaged into one soft token."""
        return self.vision.patches_per_side // self.tokens_per_side


class Projector(nnx.Module):
    """Patch features [N, n*n, E] -> soft tokens [N, Q, D]: k x k average pool, (1 + w) RMSNorm,
    then the projection matrix (transformers' mm_input_projection_weight, [E, D])."""

    def __init__(self, cfg: Gemma3VisionConfig, dtype, rngs: nnx.Rngs):
        t, k, n = cfg.tokens_per_side, cfg.pool, cfg.vision.patches_per_side
        if t * t != cfg.mm_tokens_per_image or k < 1 or t * k != n:
            raise ValueError(f"mm_tokens_per_image {cfg.mm_tokens_per_image} must be a square "
                             f"whose side divides the {n} x {n} patch grid")
        self.config = cfg
        self.norm = RMSNorm(cfg.vision.hidden_size, cfg.vision.layer_norm_eps, 1.0, dtype)
        self.proj = Linear((cfg.vision.hidden_size,), (cfg.text.hidden_size,), (None, "embed"),
                           dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        i, _, e = x.shape
        t, k = self.config.tokens_per_side, self.config.pool
        grid = x.reshape(i, t, k, t, k, e)  # [N, row block, row in it, col block, col in it, E]
        pooled = grid.astype(jnp.float32).mean(axis=(2, 4)).astype(x.dtype)  # [N, t, t, E]
        return self.proj(self.norm(pooled.reshape(i, t * t, e)))  # [N, Q, D]


class Gemma3Vision(nnx.Module):
    """(input_ids [B, T], pixel_values [N, C, Y, X], token_type_ids [B, T], ...) -> logits
    [B, T, V] (float32): the whole vision-language model."""

    def __init__(self, cfg: Gemma3VisionConfig, *, dtype=jnp.float32,
                 rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = cfg
        self.vision = VisionTower(cfg.vision, dtype=dtype, rngs=rngs)
        self.projector = Projector(cfg, dtype, rngs)
        self.text = Transformer(cfg.text, dtype=dtype, rngs=rngs)

    def image_features(self, pixel_values) -> jax.Array:
        """Soft tokens [N, Q, D] of pixel_values [N, C, Y, X] (Y = X = the tower's image_size)."""
        pixels = jnp.asarray(pixel_values)
        size = self.config.vision.image_size
        if pixels.ndim != 4 or pixels.shape[-2:] != (size, size):
            raise InputError(f"expected images [N, C, {size}, {size}] (the size the position "
                             f"table was trained for), got shape {tuple(pixels.shape)}",
                             key="pixel_values")
        return self.projector(self.vision(pixels))

    def tokens(self, input_ids) -> jax.Array:
        """input_ids [B, T] with placeholders past the vocabulary read as 0 (transformers')."""
        tokens = jnp.asarray(input_ids)
        if self.config.image_token_id >= self.config.text.vocab_size:
            tokens = jnp.where(tokens == self.config.image_token_id, 0, tokens)
        return tokens

    def embed(self, input_ids, pixel_values) -> jax.Array:
        """The text model's input embeddings [B, T, D]: the tokens' (scaled by sqrt(D)), with
        the images' soft tokens (unscaled) in place of the placeholders."""
        placeholder = jnp.asarray(input_ids) == self.config.image_token_id  # [B, T]
        self.check_images(input_ids, pixel_values)  # before the tower runs: fails at once
        embeds = self.text.embedder.encode(self.tokens(input_ids))
        features = self.image_features(pixel_values)  # [N, Q, D]
        return scatter_images(embeds, placeholder, features,
                              jnp.ones((1, features.shape[0]), jnp.bool_))

    def check_images(self, input_ids, pixel_values) -> None:
        """Raise InputError where the placeholder counts do not fit the images
        (check_flat_image_tokens); concrete inputs only, traced ones pass unchecked."""
        check_flat_image_tokens(jnp.asarray(input_ids) == self.config.image_token_id,
                                pixel_values.shape[0], self.config.mm_tokens_per_image,
                                self.config.image_token_id)

    def hidden(self, input_ids, positions=None, attention_mask=None, segment_ids=None, *,
               pixel_values=None, token_type_ids=None, branch_ids=None) -> jax.Array:
        """Final-normed hidden states [B, T, D] (arguments as `__call__`)."""
        embeds = None if pixel_values is None else self.embed(input_ids, pixel_values)
        blocks = None if token_type_ids is None else image_blocks(token_type_ids)
        return self.text.hidden(self.tokens(input_ids), positions, attention_mask, segment_ids,
                                branch_ids=branch_ids, embeds=embeds, bidirectional_ids=blocks)

    def __call__(self, input_ids, positions=None, attention_mask=None, segment_ids=None, *,
                 pixel_values=None, token_type_ids=None, branch_ids=None) -> jax.Array:
        """Logits [B, T, V]. The text arguments are the Transformer's (positions default to the
        count of real tokens before each one); pixel_values [N, C, Y, X] and token_type_ids
        [B, T] (1 on the image placeholders) as transformers' Gemma 3 processor returns them."""
        return self.text.logits_from_hidden(self.hidden(
            input_ids, positions, attention_mask, segment_ids, pixel_values=pixel_values,
            token_type_ids=token_type_ids, branch_ids=branch_ids))


def image_blocks(token_type_ids) -> jax.Array:
    """token_type_ids [B, T] -> bidirectional block ids [B, T] int32: 0 off images, b >= 1 on
    the b-th run of consecutive image tokens of the row (transformers'
    get_block_sequence_ids_for_mask, counted from 1 with 0 for text)."""
    image = jnp.asarray(token_type_ids) == 1  # [B, T]
    before = jnp.pad(image, ((0, 0), (1, 0)))[:, :-1]  # [B, T]: the previous token is image
    starts = jnp.cumsum(image & ~before, axis=1, dtype=jnp.int32)
    return jnp.where(image, starts, 0)


def check_flat_image_tokens(placeholder, images: int, per_image: int,
                            image_token_id: int) -> None:
    """idefics3.check_image_tokens for images given flat over the batch: each row's
    placeholder count must be a whole number of images of `per_image` tokens, and the batch's
    `images` times that (which row owns which image is the placeholders' order). Concrete
    inputs only; traced ones pass."""
    if isinstance(placeholder, jax.core.Tracer):
        return
    counts = np.asarray(placeholder).sum(axis=1)
    for row, n in enumerate(counts.tolist()):
        if n % per_image:
            raise InputError(
                f"Image features and image tokens do not match: row {row} has {n} image tokens "
                f"(id {image_token_id}), not a whole number of images of {per_image} features "
                "each; a prompt cut through an image?", key="input_ids")
    total = int(counts.sum())
    if total != images * per_image:
        raise InputError(
            f"Image features and image tokens do not match: the batch has {total} image tokens "
            f"(id {image_token_id}) but {images} image{'s' if images != 1 else ''} of "
            f"{per_image} features each ({images * per_image})", key="input_ids")
