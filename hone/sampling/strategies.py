"""Choosing the next token: greedy, or sampling with temperature, top-k and top-p.

Two log-probabilities come back with every token:
- `logprob`: under the model's own distribution, log_softmax(logits) with no temperature and no
  truncation. This is what a teacher-forced forward pass computes, so RL importance ratios and
  KL terms can use it directly.
- `sampling_logprob`: under the distribution the token was actually drawn from (temperature,
  then top-k, then top-p, renormalised; 0 for greedy, a point mass).

Drawing a token: inverse transform sampling with one uniform number per row, searched in two
levels (the cumulative mass of blocks of `BLOCK` tokens, then of the tokens inside the chosen
block). Exact like the Gumbel-max trick (`jax.random.categorical`), which needs a random number
and two logarithms per vocabulary entry: on the CPU those were most of a decode step's
sampling (256 rows x 49,152 tokens: 352 ms against 23 ms for the search). A token of zero
probability (truncated) is never drawn.
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


BLOCK = 256  # vocabulary entries per block of the two-level search


def _last_positive(mass: jax.Array) -> jax.Array:
    """[..., n] -> the index of the last entry > 0 along the last axis."""
    n = mass.shape[-1]
    return n - 1 - jnp.argmax(jnp.flip(mass > 0, axis=-1), axis=-1)


def draw(key: jax.Array, scaled: jax.Array) -> jax.Array:
    """One token per row of scaled [B, V] (logits; -inf or the dtype's minimum: never drawn),
    with probability softmax(scaled): the first token whose cumulative mass exceeds u x total,
    u uniform in [0, 1)."""
    b, v = scaled.shape
    pad = -v % BLOCK
    weights = jnp.exp(scaled - jnp.max(scaled, axis=-1, keepdims=True))
    weights = jnp.pad(weights, ((0, 0), (0, pad))).reshape(b, -1, BLOCK)  # [B, blocks, BLOCK]
    mass = jnp.sum(weights, axis=-1)  # [B, blocks]
    below = jnp.cumsum(mass, axis=-1)
    u = jax.random.uniform(key, (b, 1), jnp.float32) * below[:, -1:]
    block = jnp.minimum(jnp.sum(below <= u, axis=-1), _last_positive(mass))
    inside = jnp.take_along_axis(weights, block[:, None, None], axis=1)[:, 0]  # [B, BLOCK]
    before = jnp.take_along_axis(below - mass, block[:, None], axis=-1)
    j = jnp.sum(jnp.cumsum(inside, axis=-1) + before <= u, axis=-1)
    return block * BLOCK + jnp.minimum(j, _last_positive(inside))


def choose(logits: jax.Array, key: jax.Array, mode: SamplingMode, temperature: jax.Array,
           top_p: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """logits [B, V] float32 -> (token [B], logprob [B], sampling_logprob [B])."""
    def logprob(x, token):  # log softmax(x)[token], without the whole log_softmax
        return (jnp.take_along_axis(x, token[:, None], axis=-1)[:, 0]
                - jax.nn.logsumexp(x, axis=-1))

    if mode.greedy:
        token = jnp.argmax(logits, axis=-1)
        sampling_lp = jnp.zeros(token.shape, jnp.float32)
    else:
        scaled = _truncate(logits / temperature, mode, top_p)
        token = draw(key, scaled)
        sampling_lp = logprob(scaled, token)
    return token.astype(jnp.int32), logprob(logits, token), sampling_lp
