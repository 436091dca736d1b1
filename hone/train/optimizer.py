"""Optax optimizer from the `train:` section: AdamW, warmup + constant/linear/cosine schedule,
global-norm clipping."""

from __future__ import annotations

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


def build_optimizer(train) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """(optimizer, schedule) for a TrainSection."""
    schedule = learning_rate_schedule(lr=train.lr, schedule=train.schedule,
                                      warmup_steps=train.warmup_steps,
                                      max_steps=train.max_steps,
                                      min_lr_ratio=train.min_lr_ratio)
    parts = []
    if train.max_grad_norm and train.max_grad_norm > 0:
        parts.append(optax.clip_by_global_norm(train.max_grad_norm))
    parts.append(optax.adamw(schedule, b1=train.b1, b2=train.b2, eps=train.eps,
                             weight_decay=train.weight_decay))
    return optax.chain(*parts), schedule
