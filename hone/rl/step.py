"""The jitted RL update: score the rollout, then several optimizer updates on it, in one program.

`make_rl_step(...)` returns `step(state, frozen, batch, aux) -> (state, metrics)` where `batch`
is a whole rollout ([B, L] rows plus per-sequence advantages or rewards). Inside one jit:

1. `score(state, frozen, batch, aux) -> (batch, metrics)`: forward passes without gradients
   over the rollout (old log-probabilities, the reference's, the critic's values) and whatever the
   algorithm derives from them (PPO's KL-shaped rewards and GAE). Run in chunks of one
   micro-batch so memory stays that of one micro-batch. (Not the loop's `LoopSpec.prepare`:
   that host-side hook runs before the step, outside jit, and collects the rollout.)
2. `epochs x minibatches` updates: each epoch permutes the rows (a key from the state's RNG and
   step), each minibatch is one `hone.train.step.update_fn` update with its gradient accumulated
   over `accum` micro-batches and normalised by the whole minibatch's denominator, so the split
   into micro-batches never changes the update.
3. `finish(state, batch, metrics) -> state`: state changes after the updates (the adaptive KL
   coefficient, an EMA reference).

`skip_zero=True` (`grpo.skip_zero_updates`) withholds an update whose gradient is exactly zero:
a batch in which every group's rewards are equal gives every row a zero advantage, and with no
KL or other term the policy loss's gradient is then exactly zero, yet an Adam update would
still move the weights by its momentum (and its moments would decay), so a run of such steps
keeps drifting in the direction of the last informative one. The weights, the optimizer state
and the guard state stay as they were, the step counter moves on (step N still consumes batch
N), and the row logs `update_skipped` (the fraction of the step's updates withheld).

Metrics are the mean over the updates, except the keys in `FIRST_ONLY` (measured on the weights
that sampled the rollout) which are taken from the first update.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from hone.train.step import update_fn, withhold

# Metrics that describe the sampling weights: read from the first update only.
FIRST_ONLY = ("sampler_gap_sum", "sampler_gap_sq_sum", "entropy_sum")


def chunked(fn: Callable, batch: dict, chunks: int):
    """fn(sub-batch) over `chunks` equal slices of the rows, results concatenated on axis 0."""
    if chunks == 1:
        return fn(batch)
    parts = jax.tree.map(lambda x: x.reshape((chunks, x.shape[0] // chunks) + x.shape[1:]),
                         batch)
    out = jax.lax.map(fn, parts)
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)


def make_rl_step(graphdef, template, loss_fn, normalizer_fn, optimizer, schedule, *,
                 accum: int, precision: str, epochs: int = 1, minibatches: int = 1,
                 score: Callable | None = None, finish: Callable | None = None,
                 layout=None, skip_zero: bool = False):
    plain = update_fn(graphdef, template, loss_fn, normalizer_fn, optimizer, schedule,
                      accum=accum, precision=precision, layout=layout)

    def update(state, frozen, mb, aux):
        new, metrics = plain(state, frozen, mb, aux)
        if not skip_zero:
            return new, metrics
        applied = metrics["grad_norm"] != 0  # a NaN norm is applied: the guard's to handle
        return withhold(applied, new, state), dict(
            metrics, update_skipped=1.0 - applied.astype(jnp.float32))

    updates = epochs * minibatches

    def step(state, frozen, batch, aux=None):
        pre_metrics = {}
        if score is not None:
            batch, pre_metrics = score(state, frozen, batch, aux)
        rows = batch["tokens"].shape[0]
        size = rows // minibatches
        key = jax.random.fold_in(jax.random.wrap_key_data(state["rng"]), state["step"])
        key = jax.random.fold_in(key, 7919)  # apart from the dropout keys of the updates

        def one(state, i):
            if minibatches == 1:
                mb = batch
            else:
                order = jax.random.permutation(jax.random.fold_in(key, i // minibatches), rows)
                idx = jax.lax.dynamic_slice_in_dim(order, (i % minibatches) * size, size)
                mb = jax.tree.map(lambda x: x[idx], batch)
            return update(state, frozen, mb, aux)

        if updates == 1:
            state, metrics = update(state, frozen, batch, aux)
        else:
            state, stacked = jax.lax.scan(one, state, jnp.arange(updates))
            metrics = {k: (v[0] if k in FIRST_ONLY else jnp.mean(v, axis=0))
                       for k, v in stacked.items()}
        metrics = dict(metrics, **pre_metrics)
        if finish is not None:
            state = finish(state, batch, metrics)
        return state, metrics

    return jax.jit(step, donate_argnums=(0,))
