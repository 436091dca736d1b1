"""Building blocks shared by every loss: log-probabilities of targets, entropy, masked
reductions."""

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


def token_entropy(logits: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) per position: logits [B, T, V] -> [B, T] float32.

    -Σ_v p·log p from the log-softmax (never the log of a softmax), as the RL diagnostics report
    it; callers that only watch it wrap the logits in stop_gradient.
    """
    lsm = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)  # [B, T, V]
    return -jnp.sum(jnp.exp(lsm) * lsm, axis=-1)


def masked_mean(x: jax.Array, mask: jax.Array) -> jax.Array:
    """Mean of x over positions where mask is 1 (0 when the mask is empty)."""
    mask = mask.astype(jnp.float32)
    return jnp.sum(x * mask) / jnp.maximum(jnp.sum(mask), 1.0)
