"""Building blocks shared by every loss: log-probabilities of targets, masked reductions."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def token_logprobs(logits: jax.Array, targets: jax.Array) -> jax.Array:
    """log softmax(logits)[targets]: logits [B, T, V], targets [B, T] -> [B, T] float32.

    Computed as logit[target] - logsumexp(logits), which never materialises the full
    [B, T, V] log-softmax.
    """
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over positions where mask is 1 (0 when the mask is empty)."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
