"""RL losses: GRPO/RLOO advantages, the clipped policy-gradient loss (PPO, GRPO, DAPO, Dr. GRPO,
GSPO), CISPO's clipped-weight loss, per-token KL penalties, GAE, the clipped value loss and
masked whitening.

Letters: B sequences, T positions, N prompts, G samples per prompt. A mask is 1 on the tokens
that are trained (the completion) and 0 on prompt and padding. Design choices:

- Masked positions are selected away with jnp.where before any arithmetic, not only multiplied by
  the mask: a log-prob of -inf (or NaN) in the padding reaches neither the loss nor its gradient.
- Inputs narrower than float32 are promoted to float32; float64 stays float64 (the tests).
- policy_loss and value_loss take an optional `denominator`; the loss is then the aggregate's
  numerator over it. A train step that splits a batch into micro-batches passes the whole
  batch's `policy_loss_denominator` to each and sums the results: exactly the full-batch loss
  and gradient, for every aggregation (a mean per micro-batch would up-weight short ones).
- So their metrics are sums and counts ("tokens", "*_sum"), under stop_gradient, which add across
  micro-batches too; divide by "tokens" for per-token means (clip fraction, mean ratio, mean KL).
- "seq-mean-token-mean" averages over the sequences that have at least one token: an all-masked
  row (a filler that keeps the batch shape fixed, a masked-out truncated completion) neither
  counts nor dilutes. TRL averages over all rows, counting such a row as a 0.
  "seq-mean-token-sum-norm" (Dr. GRPO) divides by B·max_len over all rows: its point is a
  normaliser that does not depend on the data.
- GSPO (ratio="sequence"): s = exp(masked mean of log ρ_t) is differentiated as itself, as in
  the paper's sequence-level objective, so ∇s = s·mean_t ∇logp_t. (GSPO-token's
  sg(s)·exp(logp - sg(logp)) has the same value and, for a per-sequence advantage, the same
  gradient.)
- CISPO (MiniMax-M1, 2025) clips the importance weight, not the objective: ℓ = -sg(min(ρ,
  1+ε_high))·A·logp. The weight is detached, so every token keeps its gradient -w·A·∇logp; in
  policy_loss a token whose clipped term is selected has none.
- Zero-variance groups get advantages of exactly 0, not rounding noise over 1e-4.
- Hyper-parameters that choose a formula (scale, agg, ratio, kind, group_size, max_len) are
  checked eagerly with ValueError; numeric ones (clip_eps, kl_beta) only when plain Python
  numbers, since a schedule may trace them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.losses.common import check_choice, is_number, promote, stopped_sums

ADVANTAGE_SCALES = ("group", "batch", "none")
KL_KINDS = ("k1", "k2", "k3")
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
RATIOS = ("token", "sequence")

_STD_EPS = 1e-4  # GRPO's advantage divisor std + 1e-4 (DeepSeekMath; TRL)
_WHITEN_EPS = 1e-8  # TRL's masked_whiten


def _check_max_len(fn: str, max_len) -> None:
    if max_len is None:
        raise ValueError(f"{fn}: agg='seq-mean-token-sum-norm' needs max_len (the generation "
                         f"budget: the loss is sum(l·m) / (B·max_len))")
    if not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"{fn}: max_len must be a positive int, got {max_len!r}")


def grpo_advantages(rewards: jax.Array, group_size: int, *, scale: str = "group",
                    leave_one_out: bool = False) -> tuple[jax.Array, dict]:
    """Group-relative advantages: rewards [N·G], group-major (rows g·G..g·G+G-1 answer prompt g).

    A = r - group mean (GRPO), or with leave_one_out r_i - (Σ_group - r_i)/(G-1) (RLOO); then
    divided by the group's std + 1e-4 (scale="group"), the batch's std + 1e-4 ("batch", as in
    Dr. GRPO/TRL), or nothing ("none"). Stds use Bessel's correction and are of the rewards.
    Metrics: reward_std_zero_fraction (groups whose rewards are all equal), reward_mean,
    reward_std (of the batch, Bessel-corrected).
    """
    fn = "grpo_advantages"
    check_choice(fn, "scale", scale, ADVANTAGE_SCALES)
    (r,) = promote(rewards)
    if r.ndim != 1:
        raise ValueError(f"{fn}: rewards must be 1-D [N*G], got shape {r.shape}")
    if not isinstance(group_size, int) or group_size < 1:
        raise ValueError(f"{fn}: group_size must be a positive int, got {group_size!r}")
    if r.shape[0] % group_size:
        raise ValueError(f"{fn}: {r.shape[0]} rewards do not split into groups of {group_size}")
    if group_size < 2 and (scale == "group" or leave_one_out):
        raise ValueError(f"{fn}: group_size must be >= 2 for scale='group' or leave_one_out "
                         f"(a group std or leave-one-out mean needs two samples)")
    if r.shape[0] < 2 and scale == "batch":
        raise ValueError(f"{fn}: scale='batch' needs at least 2 rewards")

    g = r.reshape(-1, group_size)  # [N, G]
    if leave_one_out:
        baseline = (jnp.sum(g, axis=1, keepdims=True) - g) / (group_size - 1)  # [N, G]
    else:
        baseline = jnp.mean(g, axis=1, keepdims=True)  # [N, 1]
    adv = g - baseline  # [N, G]
    if scale == "group":
        adv = adv / (jnp.std(g, axis=1, ddof=1, keepdims=True) + _STD_EPS)
    elif scale == "batch":
        adv = adv / (jnp.std(r, ddof=1) + _STD_EPS)
    # An all-equal group has no signal; its mean can round away from its members, so force 0.
    constant = jnp.max(g, axis=1, keepdims=True) == jnp.min(g, axis=1, keepdims=True)  # [N, 1]
    adv = jnp.where(constant, 0.0, adv).reshape(-1)  # [N·G]
    std = jnp.std(r, ddof=1) if r.shape[0] > 1 else jnp.zeros((), r.dtype)
    metrics = {"reward_std_zero_fraction": jnp.mean(constant.astype(r.dtype)),
               "reward_mean": jnp.mean(r), "reward_std": std}
    return adv, jax.tree.map(jax.lax.stop_gradient, metrics)


def kl_penalty(logp: jax.Array, ref_logp: jax.Array, kind: str = "k3") -> jax.Array:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π: [B, T] -> [B, T], no reduction.

    k1 = logp - ref;  k2 = ½(logp - ref)²;  k3 = e^(ref-logp) - (ref-logp) - 1 (Schulman,
    "Approximating KL divergence", 2020). k3 is computed as expm1(d) - d, which keeps its
    digits when d = ref - logp is small (there e^d - 1 cancels).
    """
    check_choice("kl_penalty", "kind", kind, KL_KINDS)
    logp, ref_logp = promote(logp, ref_logp)
    d = ref_logp - logp  # [B, T] log(π_ref / π)
    if kind == "k1":
        return -d
    if kind == "k2":
        return 0.5 * d * d
    return jnp.expm1(d) - d


def policy_loss_denominator(mask: jax.Array, agg: str = "token-mean",
                            max_len: int | None = None) -> jax.Array:
    """What policy_loss divides its numerator by, for the batch `mask` [B, T] (float32 scalar).

    token-mean: the number of real tokens; seq-mean-token-mean: the number of rows with at least
    one real token; seq-mean-token-sum-norm: B·max_len. The first two are at least 1, so an
    all-masked batch has loss 0.
    """
    fn = "policy_loss_denominator"
    check_choice(fn, "agg", agg, AGGREGATIONS)
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    if agg == "token-mean":
        count = jnp.sum(keep, dtype=jnp.int32)  # integer count: exact past 2^24 tokens
    elif agg == "seq-mean-token-mean":
        count = jnp.sum(jnp.any(keep, axis=-1), dtype=jnp.int32)
    else:
        _check_max_len(fn, max_len)
        return jnp.asarray(float(keep.size // keep.shape[-1] * max_len), jnp.float32)
    return jnp.maximum(count, 1).astype(jnp.float32)


def _token_mask_and_adv(fn: str, logp, old_logp, adv, mask):
    """(keep [B, T] bool, adv [B, T] zero off the mask) after checking logp, old_logp and mask
    share one shape; adv may be per row [B] or per token [B, T]."""
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    if not logp.shape == old_logp.shape == keep.shape:
        raise ValueError(f"{fn}: logp {logp.shape}, old_logp {old_logp.shape} and mask "
                         f"{keep.shape} must have one shape")
    if adv.ndim == logp.ndim - 1:
        adv = adv[..., None]  # [B, 1]
    return keep, jnp.where(keep, jnp.broadcast_to(adv, logp.shape), 0.0)  # [B, T]


def policy_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, mask: jax.Array, *,
                clip_eps: float = 0.2, clip_eps_high: float | None = None,
                ref_logp: jax.Array | None = None, kl_beta: float = 0.0, kl_kind: str = "k3",
                agg: str = "token-mean", ratio: str = "token", max_len: int | None = None,
                is_weights: jax.Array | None = None,
                denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """Clipped surrogate loss (PPO; GRPO, DAPO, Dr. GRPO, GSPO by its options).

    logp, old_logp, mask [B, T]; adv [B] (broadcast over T) or [B, T]; ref_logp, is_weights
    [B, T]. Per token, with ρ the ratio π/π_old and ε_high = clip_eps_high or clip_eps:
      ℓ = -min(ρA, clip(ρ, 1-ε, 1+ε_high)·A)·w + β·KL(logp, ref_logp)
    where w = stop_gradient(is_weights) (a truncated importance-sampling correction for a
    sampler that differs from the trainer) or 1, and the KL term is present when ref_logp is.
    ratio "token": ρ_t = exp(logp_t - old_logp_t); "sequence" (GSPO): one ρ per sequence,
    exp of the masked mean of the log-ratio (0 for an empty row). agg: see the module notes.
    With `denominator`, returns the aggregate's numerator (Σℓm, or Σ_b Σ_tℓm/Σ_tm for
    seq-mean-token-mean) over it.

    Metrics (sums over real tokens): tokens; clipped_low_sum (ρ < 1-ε and A < 0),
    clipped_high_sum (ρ > 1+ε_high and A > 0), clipped_sum (their total: the clipped term was
    selected and the token has no gradient); ratio_sum (Σρm); kl_sum (ΣKL·m, with ref_logp).
    """
    fn = "policy_loss"
    check_choice(fn, "agg", agg, AGGREGATIONS)
    check_choice(fn, "ratio", ratio, RATIOS)
    check_choice(fn, "kl_kind", kl_kind, KL_KINDS)
    if agg == "seq-mean-token-sum-norm" and denominator is None:
        _check_max_len(fn, max_len)
    clip_eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    for name, value in (("clip_eps", clip_eps), ("clip_eps_high", clip_eps_high)):
        if is_number(value) and value < 0:
            raise ValueError(f"{fn}: {name} must be >= 0, got {value!r}")
    if ref_logp is None and not (is_number(kl_beta) and kl_beta == 0):
        raise ValueError(f"{fn}: kl_beta={kl_beta!r} needs ref_logp")

    optional = [x for x in (ref_logp, is_weights) if x is not None]
    logp, old_logp, adv, *optional = promote(logp, old_logp, adv, *optional)
    keep, adv = _token_mask_and_adv(fn, logp, old_logp, adv, mask)
    m = keep.astype(logp.dtype)  # [B, T]
    count = jnp.maximum(jnp.sum(m, axis=-1), 1.0)  # [B] real tokens per row, at least 1

    log_ratio = jnp.where(keep, logp - old_logp, 0.0)  # [B, T]
    if ratio == "sequence":
        seq = jnp.sum(log_ratio, axis=-1) / count  # [B]
        log_ratio = jnp.broadcast_to(seq[..., None], logp.shape)  # [B, T]
    rho = jnp.exp(log_ratio)  # [B, T]
    low, high = 1.0 - clip_eps, 1.0 + clip_eps_high
    per_token = -jnp.minimum(rho * adv, jnp.clip(rho, low, high) * adv)  # [B, T]
    if is_weights is not None:
        per_token = per_token * jax.lax.stop_gradient(jnp.where(keep, optional[-1], 0.0))
    metrics = {}
    if ref_logp is not None:
        ref = jnp.where(keep, optional[0], 0.0)
        kl = jnp.where(keep, kl_penalty(jnp.where(keep, logp, 0.0), ref, kl_kind), 0.0)
        metrics["kl_sum"] = kl
        if not (is_number(kl_beta) and kl_beta == 0):
            per_token = per_token + kl_beta * kl
    per_token = jnp.where(keep, per_token, 0.0)  # [B, T]

    if agg == "seq-mean-token-mean":
        numerator = jnp.sum(jnp.sum(per_token, axis=-1) / count)
    else:
        numerator = jnp.sum(per_token)
    if denominator is None:
        denominator = policy_loss_denominator(keep, agg, max_len)
    loss = numerator / denominator

    clipped_low = keep & (rho < low) & (adv < 0)
    clipped_high = keep & (rho > high) & (adv > 0)
    metrics = stopped_sums(logp.dtype, tokens=m, clipped_low_sum=clipped_low,
                    clipped_high_sum=clipped_high, clipped_sum=clipped_low | clipped_high,
                    ratio_sum=jnp.where(keep, rho, 0.0), **metrics)
    return loss, metrics


def offpolicy_weights(old_logp: jax.Array, sampler_logp: jax.Array, mask: jax.Array, *,
                      tis_cap: float | None = None, token_band: tuple = (),
                      seq_band: tuple = ()) -> tuple[jax.Array | None, dict]:
    """Per-token weights that correct for a sampler other than the trainer (a policy some
    versions behind, or other numerics), and the metrics that measure the gap.

    old_logp, sampler_logp, mask [B, T]; r = exp(old_logp - sampler_logp) per token, the
    trainer's probability of the sampled token over the sampler's. The weight is the product of
      - tis_cap: min(r, cap) (truncated importance sampling);
      - token_band (low, high): 0 for a token whose r lies outside [low, high] (IcePop);
      - seq_band (low, high): 0 for every token of a sequence whose geometric-mean ratio
        exp(mean_t log r) over its masked tokens lies outside [low, high];
    None when no correction is asked for (then the loss weighs every token 1).
    Metrics (sums; tokens and sequences are counted by the loss and here): offpolicy_k3_sum
    (Σ r - 1 - log r over real tokens: the k3 estimate of KL(sampler || trainer)),
    tis_clipped_sum (tokens with r > cap), token_masked_sum (tokens outside the band, or in a
    masked sequence), seq_masked_sum and seqs (sequences masked, sequences with a token)."""
    keep = mask > 0
    log_r = jnp.where(keep, old_logp - sampler_logp, 0.0)  # [B, T]
    r = jnp.exp(log_r)
    weights = jnp.ones_like(log_r)
    tis_clipped = jnp.zeros_like(keep)
    token_out = jnp.zeros_like(keep)
    has = jnp.any(keep, axis=-1)  # [B]
    seq_out = jnp.zeros_like(has)
    if tis_cap is not None:
        weights = jnp.minimum(r, tis_cap)
        tis_clipped = keep & (r > tis_cap)
    if token_band:
        low, high = token_band
        token_out = keep & ((r < low) | (r > high))
    if seq_band:
        low, high = seq_band
        count = jnp.maximum(jnp.sum(keep, axis=-1), 1)
        geo = jnp.exp(jnp.sum(log_r, axis=-1) / count)  # [B]
        seq_out = has & ((geo < low) | (geo > high))
    masked = token_out | (seq_out[:, None] & keep)
    weights = jnp.where(masked, 0.0, weights)
    metrics = stopped_sums(log_r.dtype, offpolicy_k3_sum=jnp.where(keep, r - 1.0 - log_r, 0.0),
                           tis_clipped_sum=tis_clipped, token_masked_sum=masked,
                           seq_masked_sum=seq_out, seqs=has)
    corrected = tis_cap is not None or bool(token_band) or bool(seq_band)
    return (jax.lax.stop_gradient(weights) if corrected else None), metrics


CISPO_AGGREGATIONS = ("token-mean", "seq-mean-token-mean")


def cispo_loss(logp: jax.Array, old_logp: jax.Array, adv: jax.Array, mask: jax.Array, *,
               clip_eps_high: float = 5.0, agg: str = "token-mean",
               denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """CISPO (MiniMax-M1, 2025): the policy gradient weighted by a clipped, detached ratio.

    logp, old_logp, mask [B, T]; adv [B] (broadcast over T) or [B, T]. Per token, with
    ρ = exp(logp - old_logp):  ℓ = -sg(min(ρ, 1 + ε_high))·A·logp,  so ∇ℓ = -w·A·∇logp on every
    token, the clipped ones included. The default cap is loose: it only bounds the weight of the
    rare tokens whose ratio is far above 1. agg "token-mean" or "seq-mean-token-mean" as in
    policy_loss; with `denominator` (policy_loss_denominator of the whole batch) the loss is the
    numerator over it, so micro-batches add up to the whole batch.

    Metrics (sums over real tokens): tokens; clipped_sum (ρ > 1+ε_high: the weight was capped,
    the gradient kept); ratio_sum (Σρm).
    """
    fn = "cispo_loss"
    check_choice(fn, "agg", agg, CISPO_AGGREGATIONS)
    if is_number(clip_eps_high) and clip_eps_high < 0:
        raise ValueError(f"{fn}: clip_eps_high must be >= 0, got {clip_eps_high!r}")
    logp, old_logp, adv = promote(logp, old_logp, adv)
    keep, adv = _token_mask_and_adv(fn, logp, old_logp, adv, mask)
    logp_kept = jnp.where(keep, logp, 0.0)  # [B, T] a -inf in the padding reaches nothing
    rho = jnp.exp(jnp.where(keep, logp - old_logp, 0.0))  # [B, T]
    weight = jax.lax.stop_gradient(jnp.minimum(rho, 1.0 + clip_eps_high))  # [B, T]
    per_token = jnp.where(keep, -weight * adv * logp_kept, 0.0)  # [B, T]
    if agg == "seq-mean-token-mean":
        count = jnp.maximum(jnp.sum(keep, axis=-1), 1).astype(logp.dtype)  # [B]
        numerator = jnp.sum(jnp.sum(per_token, axis=-1) / count)
    else:
        numerator = jnp.sum(per_token)
    if denominator is None:
        denominator = policy_loss_denominator(keep, agg)
    metrics = stopped_sums(logp.dtype, tokens=keep, clipped_sum=keep & (rho > 1.0 + clip_eps_high),
                    ratio_sum=jnp.where(keep, rho, 0.0))
    return numerator / denominator, metrics


def gae(rewards: jax.Array, values: jax.Array, mask: jax.Array, *,
        gamma: float | jax.Array = 1.0, lam: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """Generalised advantage estimation (Schulman et al. 2016): [B, T] -> (advantages, returns).

    Sequences are right-padded (mask 1 on the real tokens, then 0). With the next position's
    value and mask (0 past the end), TRL's PPO convention:
      δ_t = r_t + γ·V_{t+1}·m_{t+1} - V_t,   A_t = δ_t + γλ·m_{t+1}·A_{t+1},   R_t = A_t + V_t,
    all 0 where the mask is 0. A reverse lax.scan over T. gamma may be an array [B, T]: the
    discount from position t to t+1 (per-turn discounts of multi-turn episodes, `gae_over_mask`).
    """
    r, v = promote(rewards, values)
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    r, v = jnp.where(keep, r, 0.0), jnp.where(keep, v, 0.0)
    g = jnp.broadcast_to(jnp.asarray(gamma, r.dtype), r.shape)  # [B, T]
    pad = jnp.zeros_like(r[..., :1])  # [B, 1]
    next_m = jnp.concatenate([keep[..., 1:].astype(r.dtype), pad], axis=-1)  # [B, T]
    next_v = jnp.concatenate([v[..., 1:], pad], axis=-1)  # [B, T], already 0 past the end
    delta = r + g * next_v - v  # [B, T]

    def step(a_next, xs):  # a_next: A_{t+1} [B]
        delta_t, next_m_t, g_t = xs
        a = delta_t + g_t * lam * next_m_t * a_next
        return a, a

    time_major = tuple(jnp.moveaxis(x, -1, 0) for x in (delta, next_m, g))  # [T, B] each
    _, adv = jax.lax.scan(step, pad[..., 0], time_major, reverse=True)  # [T, B]
    adv = jnp.where(keep, jnp.moveaxis(adv, 0, -1), 0.0)  # [B, T]
    return adv, jnp.where(keep, adv + v, 0.0)


def gae_over_mask(rewards: jax.Array, values: jax.Array, mask: jax.Array, *,
                  gamma: jax.Array, lam: float = 0.95) -> tuple[jax.Array, jax.Array]:
    """`gae` over each row's masked positions only, in order, as if the positions between them
    were not there: a multi-turn episode's model tokens, with the environment's tokens between
    turns skipped, so a turn's advantage sees the rewards and values of the turns after it.
    gamma [B, T]: the discount from each masked position to the next masked one. [B, T] ->
    (advantages, returns), 0 where the mask is 0."""
    keep = jnp.asarray(mask) > 0  # [B, T]
    order = jnp.argsort(~keep, axis=-1, stable=True)  # masked positions first, in order
    back = jnp.argsort(order, axis=-1)
    take = lambda x: jnp.take_along_axis(jnp.asarray(x), order, axis=-1)  # noqa: E731
    adv, ret = gae(take(rewards), take(values), take(keep), gamma=take(gamma), lam=lam)
    return (jnp.take_along_axis(adv, back, axis=-1), jnp.take_along_axis(ret, back, axis=-1))


def value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array, *,
               clip: float = 0.2,
               denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """PPO's clipped value loss: ½·masked mean of max((v - R)², (clip(v, v_old ± c) - R)²).

    values, old_values, returns, mask [B, T]. With `denominator`: ½·masked sum / denominator
    (pass policy_loss_denominator(full_mask) to split a batch into micro-batches).
    Metrics (sums): value_clipped_sum (tokens where the clipped error is the larger), tokens.
    """
    if is_number(clip) and clip < 0:
        raise ValueError(f"value_loss: clip must be >= 0, got {clip!r}")
    v, old, ret = promote(values, old_values, returns)
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    v, old, ret = (jnp.where(keep, x, 0.0) for x in (v, old, ret))
    err = (v - ret) ** 2  # [B, T]
    err_clipped = (jnp.clip(v, old - clip, old + clip) - ret) ** 2  # [B, T]
    per_token = jnp.where(keep, jnp.maximum(err, err_clipped), 0.0)
    if denominator is None:
        denominator = policy_loss_denominator(keep, "token-mean")
    loss = 0.5 * jnp.sum(per_token) / denominator
    metrics = stopped_sums(v.dtype, value_clipped_sum=keep & (err_clipped > err), tokens=keep)
    return loss, metrics


def whiten(x: jax.Array, mask: jax.Array, *, shift_mean: bool = True) -> jax.Array:
    """(x - mean) / sqrt(var + 1e-8) over the masked elements of x (any shape; 0 elsewhere).

    TRL's masked_whiten: var is the unbiased masked variance (× n/(n-1)). With shift_mean=False
    the mean is added back (only the scale changes). One masked element (where TRL raises)
    gives var 0 and output 0 (or the mean).
    """
    (x,) = promote(x)
    keep = jnp.asarray(mask).astype(bool)
    n = jnp.sum(keep).astype(x.dtype)
    x = jnp.where(keep, x, 0.0)
    mean = jnp.sum(x) / jnp.maximum(n, 1.0)
    centred = jnp.where(keep, x - mean, 0.0)
    var = jnp.sum(centred * centred) / jnp.maximum(n - 1.0, 1.0)  # = masked mean · n/(n-1)
    out = centred * jax.lax.rsqrt(var + _WHITEN_EPS)
    if not shift_mean:
        out = out + mean
    return jnp.where(keep, out, 0.0)
