"""Preference losses: DPO and its variants, SimPO, ORPO, and the Bradley-Terry reward-model loss.

Every function takes per-sequence numbers the recipe has already computed (log-probabilities from
`sequence_logprobs`, or scalar rewards) and returns `(loss, metrics)`. Design choices:

- Every log σ is `jax.nn.log_sigmoid` (= -softplus(-x)), never log(sigmoid(x)): a margin |βd| of
  1e3 gives the exact loss (1e3 or 0) and a finite gradient, in float32 too.
- Losses and metrics are means of per-example terms taken over all elements (`jnp.mean` with no
  axis). A batch is [B]; under `jax.vmap` each example is a scalar and its "mean" is itself, so
  averaging the vmapped per-example losses gives exactly the batch loss. That includes
  reward_loss's centring term, which is a mean of per-example squares.
- Inputs narrower than float32 (bfloat16 log-probs) are promoted to float32; float64 stays float64,
  so the tests can check the formulas at float64 precision.
- Metrics are wrapped in stop_gradient: they are for logging, never for training.
- Hyper-parameters that change which formula runs (loss_type, label_smoothing) are Python values,
  checked eagerly; beta, gamma and margins may be traced (a schedule), so they are only checked
  when they are plain Python numbers.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from hone.losses.common import check_positive, promote

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge", "robust")

_LN2 = math.log(2.0)


def _mean_metrics(**values: jax.Array) -> dict:
    return {k: jax.lax.stop_gradient(jnp.mean(v)) for k, v in values.items()}


def _log1m_exp(x: jax.Array) -> jax.Array:
    """log(1 - e^x) for x < 0, accurate at both ends (Mächler 2012, "Accurately computing
    log(1-exp(-|a|))").

    Near 0, 1 - e^x cancels, so use log(-expm1(x)); far below, e^x is tiny and log1p(-e^x) keeps
    its digits. Each branch only ever sees inputs where it is accurate and its gradient is finite
    (the other gets a dummy -1), so jnp.where cannot leak a 0·inf = NaN into the gradient.
    x is capped at -tiny (the smallest normal number): a log-prob of exactly 0 (an empty or
    certain completion) or a rounding error above 0 would give log(0) = -inf; the cap keeps the
    value finite (about -87 in float32) and its gradient zero there.
    """
    x = jnp.minimum(x, -jnp.finfo(x.dtype).tiny)
    near_zero = x > -_LN2
    from_expm1 = jnp.log(-jnp.expm1(jnp.where(near_zero, x, -1.0)))
    from_exp = jnp.log1p(-jnp.exp(jnp.where(near_zero, -1.0, x)))
    return jnp.where(near_zero, from_expm1, from_exp)


def sequence_logprobs(token_logps: jax.Array, mask: jax.Array, *,
                      average: bool = False) -> jax.Array:
    """Per-sequence log-probability: token_logps [B, T], mask [B, T] (1 = completion token) -> [B].

    The sum over masked tokens (DPO), or their mean when `average` (SimPO, ORPO, and IPO as TRL
    runs it). Padded positions are selected away rather than multiplied by 0, so a -inf there
    cannot turn into NaN. An empty mask gives 0 (its mean divides by max(count, 1)).
    """
    (token_logps,) = promote(token_logps)
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    total = jnp.sum(jnp.where(keep, token_logps, 0.0), axis=-1)  # [B]
    if not average:
        return total
    count = jnp.sum(keep, axis=-1).astype(total.dtype)  # [B]
    return total / jnp.maximum(count, 1.0)


def dpo_loss(pc: jax.Array, pr: jax.Array, rc: jax.Array, rr: jax.Array, *, beta: float = 0.1,
             loss_type: str = "sigmoid", label_smoothing: float = 0.0) -> tuple[jax.Array, dict]:
    """Direct Preference Optimization and its variants.

    pc, pr: the policy's per-sequence log-probs [B] of the chosen and rejected answers; rc, rr:
    the reference model's. (Short names, as in the API contract.)

    With d = (pc - rc) - (pr - rr), the gap between the policy's and the reference's log-ratio of
    chosen over rejected, and ε = label_smoothing:
      sigmoid  -(1-ε)·logσ(βd) - ε·logσ(-βd)       DPO (Rafailov et al. 2023); ε > 0 is
                                                   conservative DPO (Mitchell 2023), ε ∈ [0, 0.5]
      ipo      (d - 1/(2β))²                       IPO (Azar et al. 2023, eq. 17; β is their τ)
      hinge    relu(1 - βd)                        SLiC (Zhao et al. 2023)
      robust   (-(1-ε)·logσ(βd) + ε·logσ(-βd))/(1-2ε)
                                                   rDPO (Chowdhury et al. 2024), ε ∈ [0, 0.5)
    averaged over the batch. Label smoothing has no meaning for ipo and hinge, so a non-zero ε
    with them is an error rather than silently ignored.

    Metrics (batch means): rewards_chosen = β(pc - rc), rewards_rejected = β(pr - rr), margin =
    their difference, accuracy = fraction with rewards_chosen > rewards_rejected (ties count 0).
    """
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"dpo_loss: loss_type must be one of {', '.join(DPO_LOSS_TYPES)}; "
                         f"got {loss_type!r}")
    eps = float(label_smoothing)
    if loss_type == "sigmoid" and not 0.0 <= eps <= 0.5:
        raise ValueError(f"dpo_loss: label_smoothing must be in [0, 0.5] for sigmoid, got {eps}")
    if loss_type == "robust" and not 0.0 <= eps < 0.5:
        # The robust loss divides by 1 - 2ε.
        raise ValueError(f"dpo_loss: label_smoothing must be in [0, 0.5) for robust, got {eps}")
    if loss_type in ("ipo", "hinge") and eps != 0.0:
        raise ValueError(f"dpo_loss: label_smoothing applies to sigmoid and robust only, "
                         f"got {eps} with loss_type={loss_type!r}")
    check_positive("dpo_loss: beta", beta)

    pc, pr, rc, rr = promote(pc, pr, rc, rr)
    chosen = pc - rc  # [B] implicit reward of the chosen answer, over β
    rejected = pr - rr  # [B]
    d = chosen - rejected  # [B]
    x = beta * d
    if loss_type == "sigmoid":
        losses = -jax.nn.log_sigmoid(x)
        if eps:  # skip the flipped term at ε = 0: plain DPO computes exactly -logσ(βd)
            losses = (1.0 - eps) * losses - eps * jax.nn.log_sigmoid(-x)
    elif loss_type == "ipo":
        losses = (d - 1.0 / (2.0 * beta)) ** 2
    elif loss_type == "hinge":
        losses = jax.nn.relu(1.0 - x)
    else:  # robust
        losses = ((-(1.0 - eps) * jax.nn.log_sigmoid(x) + eps * jax.nn.log_sigmoid(-x))
                  / (1.0 - 2.0 * eps))

    rewards_chosen, rewards_rejected = beta * chosen, beta * rejected
    metrics = _mean_metrics(
        rewards_chosen=rewards_chosen, rewards_rejected=rewards_rejected,
        margin=rewards_chosen - rewards_rejected,
        accuracy=(rewards_chosen > rewards_rejected).astype(x.dtype))
    return jnp.mean(losses), metrics


def simpo_loss(c: jax.Array, r: jax.Array, *, beta: float = 2.0,
               gamma: float = 0.5) -> tuple[jax.Array, dict]:
    """SimPO (Meng et al. 2024): mean of -logσ(β(c - r) - γ); c, r length-averaged log-probs [B].

    No reference model: the length-averaged log-prob is the implicit reward. γ is the absolute
    target margin (as in TRL's CPO trainer); the SimPO repository's `gamma_beta_ratio` is γ/β.
    Metrics (batch means): rewards_chosen = βc, rewards_rejected = βr, margin, accuracy.
    """
    check_positive("simpo_loss: beta", beta)
    c, r = promote(c, r)
    losses = -jax.nn.log_sigmoid(beta * (c - r) - gamma)  # [B]
    rewards_chosen, rewards_rejected = beta * c, beta * r
    metrics = _mean_metrics(
        rewards_chosen=rewards_chosen, rewards_rejected=rewards_rejected,
        margin=rewards_chosen - rewards_rejected,
        accuracy=(rewards_chosen > rewards_rejected).astype(c.dtype))
    return jnp.mean(losses), metrics


def orpo_loss(c: jax.Array, r: jax.Array, chosen_nll: jax.Array, *,
              beta: float = 0.1) -> tuple[jax.Array, dict]:
    """ORPO (Hong et al. 2024): mean(nll) - β·mean(logσ(log_odds)).

    c, r: length-averaged log-probs [B] (≤ 0) of the chosen and rejected answers; chosen_nll
    [B]: the SFT loss of the chosen answer. log_odds = log(odds_c / odds_r) with odds = p/(1-p),
    i.e. (c - r) - (log(1 - e^c) - log(1 - e^r)); log(1 - e^x) is computed stably, and finitely at
    x = 0 (see _log1m_exp), where the naive log1p(-exp(x)) of TRL gives -inf.

    Metrics (batch means, TRL's names): nll, log_odds_ratio = logσ(log_odds), log_odds_chosen =
    log_odds, accuracy = fraction with c > r.
    """
    c, r, nll = promote(c, r, chosen_nll)
    log_odds = (c - r) - (_log1m_exp(c) - _log1m_exp(r))  # [B]
    ratio = jax.nn.log_sigmoid(log_odds)  # [B]
    loss = jnp.mean(nll) - beta * jnp.mean(ratio)
    metrics = _mean_metrics(nll=nll, log_odds_ratio=ratio, log_odds_chosen=log_odds,
                            accuracy=(c > r).astype(c.dtype))
    return loss, metrics


def reward_loss(chosen: jax.Array, rejected: jax.Array, *, margin: jax.Array | float | None = None,
                center_coef: float = 0.0) -> tuple[jax.Array, dict]:
    """Bradley-Terry reward-model loss on scalar rewards [B] of the chosen and rejected answers.

    mean(-logσ(chosen - rejected - margin)) + center_coef·mean((chosen + rejected)²).
    `margin` (scalar or [B]) demands a gap between the rewards (Llama 2, Touvron et al. 2023);
    the centring term pulls each pair's reward sum to 0 so rewards stay near zero mean
    (Eisenstein et al. 2023; TRL's center_rewards_coefficient).

    Metrics (batch means): accuracy = fraction with chosen > rejected, margin = chosen - rejected
    (the rewards' gap, not the margin argument), reward_mean = mean over all 2B rewards.
    """
    c, r = promote(chosen, rejected)
    gap = c - r  # [B]
    logits = gap if margin is None else gap - jnp.asarray(margin, c.dtype)
    loss = -jnp.mean(jax.nn.log_sigmoid(logits)) + center_coef * jnp.mean((c + r) ** 2)
    metrics = _mean_metrics(accuracy=(c > r).astype(c.dtype), margin=gap,
                            reward_mean=(c + r) / 2.0)
    return loss, metrics


def pair_count(batch) -> jax.Array:
    """The normalizer of a preference batch: its real pairs (`pair_valid` [B]), at least 1, so
    a sum of per-pair losses over micro-batches divided by it is the whole batch's mean."""
    return jnp.maximum(jnp.sum(batch["pair_valid"]), 1.0)
