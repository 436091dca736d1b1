"""Supervised fine-tuning: negative log-likelihood of the target tokens."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.losses.common import token_logprobs


def sft_loss(logits: jax.Array, targets: jax.Array, loss_mask: jax.Array,
             normalizer: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """Summed masked NLL divided by `normalizer` (default: the number of target tokens).

    logits [B, T, V], targets [B, T], loss_mask [B, T] (1 = trained). Gradient accumulation
    passes the token count of the whole accumulated batch as normalizer, so micro-batches of
    different sizes add up to exactly the loss of one large batch.
    """
    return sft_loss_from_logprobs(token_logprobs(logits, targets), loss_mask, normalizer)


def sft_loss_from_logprobs(token_logp: jax.Array, loss_mask: jax.Array,
                           normalizer: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """sft_loss from the target tokens' log-probabilities token_logp [B, T] (as a chunked LM
    head returns them, `hone.models.head`): the same loss and metrics."""
    mask = loss_mask.astype(jnp.float32)
    nll = -token_logp * mask
    tokens = jnp.sum(mask)
    denom = jnp.maximum(tokens, 1.0) if normalizer is None else normalizer
    loss = jnp.sum(nll) / denom
    return loss, {"nll_sum": jnp.sum(nll), "target_tokens": tokens}
