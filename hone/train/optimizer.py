"""Optax optimizer from the `train:` section: AdamW, warmup + constant/linear/cosine schedule,
global-norm clipping.

The optimizer takes the guards' learning-rate scale as an extra argument of `update`
(`lr_scale=`, see `ScaledLR`). It multiplies the scalar step size, -lr * lr_scale, before the
step size meets the updates, so a scale of 1.0 leaves every bit of a healthy run as it was, and
the train step needs no branch on the scale (a `lax.cond` around AdamW cost a quarter of the
SmolLM2 SFT step on CPU: XLA copies every parameter and moment out of the branch).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def learning_rate_schedule(*, lr: float, schedule: str, warmup_steps: int, max_steps: int,
                           min_lr_ratio: float = 0.0) -> optax.Schedule:
    """Linear warmup from 0 to lr over warmup_steps, then constant, linear or cosine decay to
    lr * min_lr_ratio at max_steps."""
    decay_steps = max(max_steps - warmup_steps, 1)
    end = lr * min_lr_ratio
    if schedule == "constant":
        main = optax.constant_schedule(lr)
    elif schedule == "linear":
        main = optax.linear_schedule(lr, end, decay_steps)
    elif schedule == "cosine":
        main = optax.cosine_decay_schedule(lr, decay_steps, alpha=min_lr_ratio)
    else:
        raise ValueError(f"unknown schedule {schedule!r}")
    if warmup_steps <= 0:
        return main
    warmup = optax.linear_schedule(0.0, lr, warmup_steps)
    return optax.join_schedules([warmup, main], [warmup_steps])


class ScaledLR(optax.GradientTransformationExtraArgs):
    """An optimizer whose `update(..., lr_scale=s)` multiplies its learning rate by s (a scalar
    array; None or absent: 1). The train step passes the guards' scale only to these."""


def scale_by_scaled_learning_rate(
        schedule: optax.Schedule) -> optax.GradientTransformationExtraArgs:
    """`optax.scale_by_learning_rate(schedule)` with the extra argument `lr_scale`: updates are
    multiplied by -schedule(count) * lr_scale. Same state (`ScaleByScheduleState`) and, with
    no scale, the same arithmetic as optax's."""

    def init(params):
        del params
        return optax.ScaleByScheduleState(count=jnp.zeros([], jnp.int32))

    def update(updates, state, params=None, *, lr_scale=None, **extra):
        del params, extra
        step_size = -1 * schedule(state.count)
        if lr_scale is not None:
            step_size = step_size * lr_scale
        updates = jax.tree.map(lambda g: jnp.array(step_size, dtype=g.dtype) * g, updates)
        return updates, optax.ScaleByScheduleState(count=optax.safe_increment(state.count))

    return optax.GradientTransformationExtraArgs(init, update)


def build_optimizer(train) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, schedule) for a TrainSection."""
    schedule = learning_rate_schedule(lr=train.lr, schedule=train.schedule,
                                      warmup_steps=train.warmup_steps,
                                      max_steps=train.max_steps,
                                      min_lr_ratio=train.min_lr_ratio)
    parts = []
    if train.max_grad_norm and train.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(train.max_grad_norm))
    # optax.adamw's own chain (same state layout, so checkpoints are unchanged), its last
    # transform taking the guards' scale.
    parts.append(optax.chain(
        optax.scale_by_adam(b1=train.b1, b2=train.b2, eps=train.eps),
        optax.add_decayed_weights(train.weight_decay),
        scale_by_scaled_learning_rate(schedule)))
    return ScaledLR(*optax.chain(*parts)), schedule


def rl_optimizer(train, updates_per_step: int):
    """The optimizer with its schedule counted in updates (several per RL step)."""
    from dataclasses import replace
    return build_optimizer(replace(train, max_steps=train.max_steps * updates_per_step,
                                   warmup_steps=train.warmup_steps * updates_per_step))
