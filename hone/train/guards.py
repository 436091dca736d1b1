"""Training guards: skip non-finite steps, and roll back to the newest checkpoint with a lower
learning rate on repeated non-finite steps, a loss spike, a gradient-norm or a KL overshoot.

Design choices:
- The guard's state lives in the train state (`state["guard"]`, scalars only), so it is
  checkpointed with everything else and a resumed run makes the same decisions: the loss EMA,
  the counters, the learning-rate scale and a pending trip all come back from the checkpoint.
- The limits (`GuardSection`) travel in the state too (`state["guard"]["limits"]`), as dynamic
  scalars: the step keeps its `(state, frozen, batch, aux)` signature, the recipes need not pass
  anything new, and changing a limit never recompiles. The loop writes the limits of the current
  config into the state after a restore, so the config in force wins over the checkpoint's.
- Skipping happens inside the jitted step (`guard_update`): the new parameters and optimizer
  state are chosen against the old ones with `jnp.where` on `isfinite(loss) & isfinite(grad
  norm)`, so no host sync is added. The step counter still advances on a skipped step, so
  step N always consumes batch N, the schedule and the RNG stream move on, and a skipped step
  looks like any other in the logs (with `guard/skipped` counting it).
- A trip (the non-finite streak reaching `max_skips`, a spike, a gradient-norm overshoot) is
  decided inside the step too and is sticky: from the tripping step on, updates are withheld
  until the loop notices. The loop reads the flag only where it syncs anyway (a logged step,
  before a checkpoint save, at the end, on a signal), so the outcome does not depend on when it
  looks, and no tripped state is ever saved. The tripping step's own update is withheld too: a
  spike means the weights (or the batch) are bad now.
- Rollback (`rollback`) restores the newest checkpoint (state and data position, so the same
  batches come again), carries the run's counters over, multiplies `lr_scale` by `lr_factor`
  and clears the trip. The step passes `lr_scale` to the optimizer, which multiplies its scalar
  step size by it (hone/train/optimizer.py: the learning rate times the scale, weight decay
  included); 1.0 leaves every number of a healthy run unchanged. There must be a checkpoint to
  return to: a trip before the first save stops the run (`GuardError`), as does a trip after
  `max_rollbacks` rollbacks.
- The KL guard is decided on the host from the logged `kl` (RL rows derive it from `kl_sum`),
  so it looks at logged steps only, and rolls back the same way.
- The spike test compares against an EMA of the losses of applied steps, and only after
  `warmup_steps` of them; it assumes a positive loss (SFT, DPO, reward models), so RL runs
  should guard on `max_kl` instead.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

from hone.config.schema import GuardSection
from hone.errors import InputError

# Why the guard tripped; `guard/tripped` in the metrics holds the code.
REASONS = {1: "non-finite loss or gradients", 2: "loss spike", 3: "gradient norm above limit",
           4: "KL above limit"}
KL_TRIP = 4


class GuardError(InputError):
    """The guards cannot recover: no checkpoint to return to, or too many rollbacks."""


def limits(section: GuardSection) -> dict[str, jax.Array]:
    """The section's limits as scalars for the state; 'off' becomes a value that never trips."""
    return {
        "max_skips": jnp.asarray(section.max_skips, jnp.int32),
        "spike_factor": jnp.asarray(section.spike_factor or 0.0, jnp.float32),  # 0 = off
        "ema_beta": jnp.asarray(section.ema_beta, jnp.float32),
        "warmup_steps": jnp.asarray(section.warmup_steps, jnp.int32),
        "max_grad_norm": jnp.asarray(section.max_grad_norm or math.inf, jnp.float32),
    }


def init_state(section: GuardSection | None = None) -> dict[str, Any]:
    """The guard part of a fresh train state."""
    i32 = lambda: jnp.zeros((), jnp.int32)  # noqa: E731
    return {
        "lr_scale": jnp.ones((), jnp.float32),  # multiplies every update; x lr_factor per rollback
        "ema": jnp.zeros((), jnp.float32),  # moving average of the applied steps' losses
        "seen": i32(),  # applied steps averaged into the EMA
        "streak": i32(),  # non-finite steps in a row
        "skipped": i32(),  # non-finite steps skipped in this run, rollbacks included
        "rollbacks": i32(),
        "tripped": i32(),  # 0, or the REASONS code of a trip the loop has not handled yet
        "limits": limits(section or GuardSection()),
    }


def configure(state: dict[str, Any], section: GuardSection) -> dict[str, Any]:
    """`state` with the limits of `section` (the config in force, after a restore)."""
    if "guard" not in state:
        return state
    return dict(state, guard=dict(state["guard"],
                                  limits=_placed_like(limits(section), state["guard"]["limits"])))


def _placed_like(new, old):
    """`new`'s scalars on the devices of the `old` ones they replace (replicated on a mesh,
    committed after a restore, as the step returns them). A scalar placed otherwise is another
    input type, and the step would be compiled once for the first call and again for the rest."""
    return jax.tree.map(lambda n, o: jax.device_put(n, o.sharding)
                        if getattr(o, "committed", False) else n, new, old)


def guard_update(old: dict[str, Any], new: dict[str, Any], loss: jax.Array,
                 grad_norm: jax.Array) -> tuple[dict[str, Any], dict[str, jax.Array]]:
    """Inside the jitted step: `new` (the updated state) with its params and opt_state put
    back to `old`'s when the step is withheld, its guard state advanced; and the guard metrics.
    """
    g, lim = old["guard"], old["guard"]["limits"]
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    streak = jnp.where(finite, 0, g["streak"] + 1)
    warm = (g["seen"] > 0) & (g["seen"] >= lim["warmup_steps"])
    spike = finite & warm & (lim["spike_factor"] > 0) & (loss > lim["spike_factor"] * g["ema"])
    steep = finite & (grad_norm > lim["max_grad_norm"])
    reason = jnp.where(streak >= lim["max_skips"], 1,
                       jnp.where(spike, 2, jnp.where(steep, 3, 0))).astype(jnp.int32)
    tripped = jnp.where(g["tripped"] > 0, g["tripped"], reason)
    apply = finite & (tripped == 0)
    beta = lim["ema_beta"]
    ema = jnp.where(g["seen"] == 0, loss, beta * g["ema"] + (1 - beta) * loss)
    guard = dict(g, streak=streak, tripped=tripped,
                 ema=jnp.where(apply, ema, g["ema"]).astype(jnp.float32),
                 seen=g["seen"] + apply.astype(jnp.int32),
                 skipped=g["skipped"] + (~finite).astype(jnp.int32))
    keep = lambda n, o: jnp.where(apply, n, o)  # noqa: E731
    state = dict(new, guard=guard, params=jax.tree.map(keep, new["params"], old["params"]),
                 opt_state=jax.tree.map(keep, new["opt_state"], old["opt_state"]))
    return state, metrics(guard)


def metrics(guard: dict[str, Any]) -> dict[str, jax.Array]:
    """The guard's logged numbers (keys `guard/...`)."""
    return {"guard/skipped": guard["skipped"], "guard/rollbacks": guard["rollbacks"],
            "guard/lr_scale": guard["lr_scale"], "guard/tripped": guard["tripped"],
            "guard/loss_ema": guard["ema"]}


def tripped(state: dict[str, Any]) -> int:
    """The pending trip's REASONS code (0 = none); reads one scalar from the device."""
    if "guard" not in state:
        return 0
    return int(jax.device_get(state["guard"]["tripped"]))


def kl_overshoot(section: GuardSection, metrics_row: dict) -> bool:
    """Host-side KL guard over a logged row: GRPO's per-token `kl`, else PPO's per-sequence
    `kl_seq` (neither in it: nothing to check)."""
    kl = metrics_row.get("kl", metrics_row.get("kl_seq"))
    return section.max_kl is not None and kl is not None and float(kl) > section.max_kl


def rollback(tripped_state: dict[str, Any], restored: dict[str, Any], section: GuardSection,
             reason: int, step: int, restored_step: int | None) -> dict[str, Any]:
    """The state to continue from after a trip at `step`: the restored checkpoint's state with
    the run's counters carried over, the learning-rate scale lowered and the trip cleared.
    GuardError when the rollback budget is spent or there is no checkpoint."""
    g = jax.device_get(tripped_state["guard"])
    why = REASONS.get(reason, f"reason {reason}")
    if restored_step is None:
        raise GuardError(f"training tripped a guard ({why}) at step {step} before the first "
                         f"checkpoint, so there is nothing to roll back to; save earlier "
                         f"(checkpoint.every_steps) or loosen the guard", key="guard")
    if int(g["rollbacks"]) >= section.max_rollbacks:
        raise GuardError(f"training tripped a guard ({why}) at step {step} after "
                         f"{int(g['rollbacks'])} rollbacks (guard.max_rollbacks = "
                         f"{section.max_rollbacks}); stopping. The newest checkpoint is step "
                         f"{restored_step}; lower train.lr or inspect the data near step {step}",
                         key="guard.max_rollbacks")
    guard = dict(restored["guard"],
                 lr_scale=jnp.asarray(float(g["lr_scale"]) * section.lr_factor, jnp.float32),
                 rollbacks=jnp.asarray(int(g["rollbacks"]) + 1, jnp.int32),
                 skipped=jnp.asarray(int(g["skipped"]), jnp.int32),
                 streak=jnp.zeros((), jnp.int32), tripped=jnp.zeros((), jnp.int32),
                 limits=limits(section))
    return dict(restored, guard=_placed_like(guard, restored["guard"]))
