"""KTO (Ethayarajh et al. 2024, "KTO: Model Alignment as Prospect Theoretic Optimization"):
a preference loss on unpaired examples, each labelled desirable or undesirable.

With r = log π(y|x) - log π_ref(y|x) the implicit reward of an example and z0 the reference
point, an estimate of KL(π ‖ π_ref) from mismatched pairs (a prompt with another example's
completion), each example's loss is
    desirable:    λ_D·(1 - σ(β(r - z0)))
    undesirable:  λ_U·(1 - σ(β(z0 - r)))
and the batch loss their mean. Design choices:

- z0 = max(0, mean(kl_policy - kl_ref)) is under stop_gradient (as in the paper and TRL): it
  shifts where each example's sigmoid sits, never a direction to move the weights in.
- The reference point has its own function (`kto_reference_point`) and the per-example terms
  theirs (`kto_terms`), so a train step that splits a batch into micro-batches computes z0
  once over the whole batch (every device, every micro-batch) and then sums per-example losses
  over the batch's example count: exactly the whole batch's loss and gradient. `kto_loss` is
  the two together over one batch; its kl arrays need not be as long as the examples (pass the
  whole batch's with one micro-batch's examples).
- Inputs narrower than float32 are promoted to float32; float64 stays float64 (the tests).
- Per-class metrics average over that class's examples (0 for an absent class); they are under
  stop_gradient.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.losses.common import check_positive, promote


def kto_reference_point(kl_policy_logps: jax.Array, kl_ref_logps: jax.Array,
                        valid: jax.Array | None = None) -> jax.Array:
    """z0 = max(0, mean(kl_policy - kl_ref)) over the mismatched pairs [K] (those where `valid`
    is 1, when given; 0 when there are none), under stop_gradient. Scalar."""
    p, r = promote(kl_policy_logps, kl_ref_logps)
    gap = p - r  # [K] log-ratio of each mismatched completion
    if valid is None:
        mean = jnp.mean(gap)
    else:
        keep = jnp.asarray(valid).astype(bool)  # [K]
        mean = jnp.sum(jnp.where(keep, gap, 0.0)) / jnp.maximum(jnp.sum(keep), 1).astype(p.dtype)
    return jax.lax.stop_gradient(jnp.maximum(mean, 0.0))


def kto_terms(policy_logps: jax.Array, ref_logps: jax.Array, desirable: jax.Array,
              z0: jax.Array, *, beta: float = 0.1, desirable_weight: float = 1.0,
              undesirable_weight: float = 1.0) -> tuple[jax.Array, jax.Array]:
    """Per-example KTO losses [B] and implicit rewards β·r [B] for a given reference point z0
    (a scalar; used as given, so detach it). desirable [B] bool (or 0/1)."""
    p, r, z0 = promote(policy_logps, ref_logps, z0)
    good = jnp.asarray(desirable).astype(bool)  # [B]
    ratio = p - r  # [B]
    # 1 - σ(x) = σ(-x): desirable x = β(r - z0), undesirable x = β(z0 - r).
    losses = jnp.where(good, desirable_weight * jax.nn.sigmoid(beta * (z0 - ratio)),
                       undesirable_weight * jax.nn.sigmoid(beta * (ratio - z0)))  # [B]
    return losses, beta * ratio


def kto_loss(policy_logps: jax.Array, ref_logps: jax.Array, desirable: jax.Array,
             kl_policy_logps: jax.Array, kl_ref_logps: jax.Array, *, beta: float = 0.1,
             desirable_weight: float = 1.0,
             undesirable_weight: float = 1.0) -> tuple[jax.Array, dict]:
    """KTO's loss over a batch (module docstring): mean over the B examples.

    policy_logps, ref_logps: per-sequence completion log-probs [B] of the policy and the
    reference; desirable: bool [B]; kl_policy_logps, kl_ref_logps: the same of mismatched
    pairs [K] (usually K = B), from which z0 is taken.

    Metrics (means over each class): rewards_desirable, rewards_undesirable (β·r), margin
    (their difference), logps_desirable, logps_undesirable (the policy's); z0; kl (the mean
    log-ratio of the mismatched pairs before the clamp at 0); desirable (the fraction).
    """
    check_positive("kto_loss: beta", beta)
    for name, value in (("desirable_weight", desirable_weight),
                        ("undesirable_weight", undesirable_weight)):
        if isinstance(value, (int, float)) and value < 0:
            raise ValueError(f"kto_loss: {name} must be >= 0, got {value!r}")
    p, r, kp, kr = promote(policy_logps, ref_logps, kl_policy_logps, kl_ref_logps)
    z0 = kto_reference_point(kp, kr)
    losses, rewards = kto_terms(p, r, desirable, z0, beta=beta,
                                desirable_weight=desirable_weight,
                                undesirable_weight=undesirable_weight)
    good = jnp.asarray(desirable).astype(bool)  # [B]

    def class_mean(x, which):
        return jnp.sum(jnp.where(which, x, 0.0)) / jnp.maximum(jnp.sum(which), 1).astype(x.dtype)

    metrics = {"rewards_desirable": class_mean(rewards, good),
               "rewards_undesirable": class_mean(rewards, ~good),
               "logps_desirable": class_mean(p, good), "logps_undesirable": class_mean(p, ~good),
               "z0": z0, "kl": jnp.mean(kp - kr), "desirable": jnp.mean(good.astype(p.dtype))}
    metrics["margin"] = metrics["rewards_desirable"] - metrics["rewards_undesirable"]
    return jnp.mean(losses), jax.tree.map(jax.lax.stop_gradient, metrics)
