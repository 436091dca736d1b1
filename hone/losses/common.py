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


# ---- argument checks and dtype rules shared by the loss modules ------------------------

def promote(*xs) -> tuple[jax.Array, ...]:
    """The inputs as arrays of one floating dtype, at least float32."""
    xs = [jnp.asarray(x) for x in xs]
    dtype = jnp.promote_types(jnp.result_type(*xs), jnp.float32)
    return tuple(x.astype(dtype) for x in xs)


def check_positive(name: str, value) -> None:
    """A ValueError unless a plain number is > 0."""
    # A traced value (a beta schedule inside jit) cannot be checked here, and need not be.
    if isinstance(value, (int, float)) and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")


def check_choice(fn: str, name: str, value, choices: tuple[str, ...]) -> None:
    """A ValueError naming the function, the argument and the choices for an unknown setting."""
    if value not in choices:
        raise ValueError(f"{fn}: {name} must be one of {', '.join(choices)}; got {value!r}")


def is_number(x) -> bool:
    """A Python int or float (not a bool, not a traced array: those are checked elsewhere)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def stopped_sums(dtype, **values: jax.Array) -> dict:
    """Each value summed, in `dtype`, outside the gradient (metrics that a step adds up)."""
    return {k: jax.lax.stop_gradient(jnp.sum(v).astype(dtype)) for k, v in values.items()}
