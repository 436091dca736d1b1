"""Choosing the next token: greedy, or sampling with temperature, top-k and top-p.

Two log-probabilities come back with every token:
- `logprob`: under the model's own distribution, log_softmax(logits) with no temperature and no
  truncation. This is what a teacher-forced forward pass computes, so RL importance ratios and
  KL terms can use it directly.
- `sampling_logprob`: under the distribution the token was actually drawn from (temperature,
  then top-k, then top-p, renormalised; 0 for greedy, a point mass).
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp


@dataclass(frozen=True)
class SamplingMode:
    """The static part of sampling settings (changes compile a new decode loop)."""

    greedy: bool = True
    top_k: int | None = None  # keep the k most likely tokens
    use_top_p: bool = False  # the nucleus mass itself is a traced value


def _truncate(scaled: jax.Array, mode: SamplingMode, top_p: jax.Array) -> jax.Array:
    """Set logits outside the top-k / top-p set to -inf. scaled [B, V]."""
    neg = jnp.finfo(scaled.dtype).min
    if mode.top_k is not None:
        values = jax.lax.top_k(scaled, mode.top_k)[0]  # [B, k] sorted descending
        scaled = jnp.where(scaled < values[:, -1:], neg, scaled)
    else:
        values = jnp.sort(scaled, axis=-1)[:, ::-1] if mode.use_top_p else None
    if mode.use_top_p:
        probs = jax.nn.softmax(values, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each sorted token
        keep = before < top_p  # the smallest prefix reaching top_p; the first always stays
        threshold = jnp.min(jnp.where(keep, values, jnp.inf), axis=-1, keepdims=True)
        scaled = jnp.where(scaled < threshold, neg, scaled)
    return scaled


def choose(logits: jax.Array, key: jax.Array, mode: SamplingMode, temperature: jax.Array,
           top_p: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """logits [B, V] float32 -> (token [B], logprob [B], sampling_logprob [B])."""
    model_lp = jax.nn.log_softmax(logits, axis=-1)
    if mode.greedy:
        token = jnp.argmax(logits, axis=-1)
        sampling_lp = jnp.zeros(token.shape, jnp.float32)
    else:
        scaled = _truncate(logits / temperature, mode, top_p)
        token = jax.random.categorical(key, scaled, axis=-1)
        sampling_lp = jnp.take_along_axis(jax.nn.log_softmax(scaled, axis=-1),
                                          token[:, None], axis=-1)[:, 0]
    lp = jnp.take_along_axis(model_lp, token[:, None], axis=-1)[:, 0]
    return token.astype(jnp.int32), lp, sampling_lp
