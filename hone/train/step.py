"""The jitted train step: forward, loss, gradients accumulated over micro-batches, optimizer
update; and the matching evaluation step.

Design choices:
- One function of (state, frozen, batch), jitted once with the state donated. The model's graph
  definition and the loss are closed over (static); weights are arguments.
- Gradient accumulation scans over micro-batches and divides by a normalizer computed from the
  whole batch (for SFT: its number of target tokens), so 4 x 1 gives the update of 1 x 4.
- Precision "bf16" casts parameters to bfloat16 for the forward pass only; the master weights,
  gradients and optimizer state stay float32, and logits/softmax are computed in float32.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from hone.train.state import unflatten

# loss_fn(model, micro_batch, normalizer, rng_key, aux) -> (loss, metrics): metrics are sums
# over the micro-batch (e.g. "target_tokens"), so they add up across micro-batches. `aux` is any
# other pytree the loss reads but never trains (a frozen reference model's weights), passed to
# the jitted step as an argument so it is never baked into the program as a constant.
LossFn = Callable[[nnx.Module, dict, jax.Array, jax.Array, Any], tuple[jax.Array, dict]]
# normalizer_fn(batch) -> scalar the summed loss of the whole batch is divided by.
NormalizerFn = Callable[[dict], jax.Array]


def _cast(tree, dtype):
    return jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, tree)


def _tree_add(a, b):
    return jax.tree.map(jnp.add, a, b)


def merge(graphdef, template, params, frozen, precision: str, dropout_key=None):
    """The model for one forward pass, in the compute precision.

    With a dropout_key the model is in training mode and its dropout stream is reseeded from
    the key: the frozen state is not returned from the step, so a stream left to advance by
    itself would repeat the same masks every step.
    """
    if precision == "bf16":
        params, frozen = _cast(params, jnp.bfloat16), _cast(frozen, jnp.bfloat16)
    model = nnx.merge(graphdef, unflatten(template, params), frozen)
    if dropout_key is not None:
        model.train()
        nnx.reseed(model, dropout=dropout_key)
    return model


def make_train_step(graphdef, template, loss_fn: LossFn, normalizer_fn: NormalizerFn,
                    optimizer: optax.GradientTransformation, schedule: optax.Schedule, *,
                    accum: int, precision: str = "fp32"):
    """A jitted `step(state, frozen, batch, aux=None) -> (state, metrics)`; batch leaves are
    [B, ...]."""
    return jax.jit(update_fn(graphdef, template, loss_fn, normalizer_fn, optimizer, schedule,
                             accum=accum, precision=precision), donate_argnums=(0,))


def update_fn(graphdef, template, loss_fn: LossFn, normalizer_fn: NormalizerFn,
              optimizer: optax.GradientTransformation, schedule: optax.Schedule, *,
              accum: int, precision: str = "fp32"):
    """The unjitted `step(state, frozen, batch, aux=None) -> (state, metrics)`: one optimizer
    update from one batch. RL recipes call it several times inside their own jitted step."""

    def micro(params, frozen, mb, normalizer, key, aux):
        model = merge(graphdef, template, params, frozen, precision,
                      dropout_key=jax.random.fold_in(key, 1))
        return loss_fn(model, mb, normalizer, key, aux)

    grad_fn = jax.value_and_grad(micro, has_aux=True)

    def step(state: dict[str, Any], frozen, batch: dict, aux=None) -> tuple[dict[str, Any], dict]:
        params = state["params"]
        normalizer = normalizer_fn(batch)
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        mbs = jax.tree.map(lambda x: x.reshape((accum, x.shape[0] // accum) + x.shape[1:]),
                           batch)
        if accum == 1:
            first = jax.tree.map(lambda x: x[0], mbs)
            (loss, sums), grads = grad_fn(params, frozen, first, normalizer,
                                          jax.random.fold_in(key, 0), aux)
        else:
            def body(carry, xs):
                mb, i = xs
                (l, m), g = grad_fn(params, frozen, mb, normalizer, jax.random.fold_in(key, i),
                                    aux)
                return jax.tree.map(jnp.add, carry, (g, l, m)), None

            first = jax.tree.map(lambda x: x[0], mbs)
            shapes = jax.eval_shape(grad_fn, params, frozen, first, normalizer, key, aux)
            (l_shape, m_shape), g_shape = shapes
            zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype),
                                 (g_shape, l_shape, m_shape))
            (grads, loss, sums), _ = jax.lax.scan(body, zeros, (mbs, jnp.arange(accum)))
        updates, opt_state = optimizer.update(grads, state["opt_state"], params)
        new_state = dict(state, step=state["step"] + 1, opt_state=opt_state,
                         params=optax.apply_updates(params, updates))
        metrics = dict(sums, loss=loss, grad_norm=optax.tree.norm(grads),
                       lr=schedule(state["step"]))
        return new_state, metrics

    return step


def make_eval_step(graphdef, template, loss_fn: LossFn, *, precision: str = "fp32"):
    """A jitted `eval_step(params, frozen, batch, aux=None) -> metrics` (sums; no
    normalisation)."""

    def step(params, frozen, batch, aux=None):
        model = merge(graphdef, template, params, frozen, precision)
        _, metrics = loss_fn(model, batch, jnp.float32(1.0), jax.random.key(0), aux)
        return metrics

    return jax.jit(step)
