"""hone.losses.rl: hand-computed values, parity with float64 transcriptions of the published
formulas, the micro-batch and vmap contracts, masked garbage, and argument checks.

The tolerance is 1e-6 (relative and absolute) everywhere and is never loosened. References: TRL's
GRPO/PPO code transcribed into torch float64 for the policy and value losses (autograd gives
their gradients), numpy float64 for advantages, KL estimators and whitening, and a plain Python
double loop over the explicit sum A_t = Σ_k (γλ)^(k-t) δ_k for GAE. Parity checks run jax with
jax_enable_x64 so that they test the formulas, not float32 rounding; hand-computed values are
checked in float32, the dtype training uses.
"""

import functools
import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from hone.losses import (gae, grpo_advantages, kl_penalty, policy_loss, policy_loss_denominator,
                         value_loss, whiten)

TOL = 1e-6  # fixed; never loosened
AGGS = ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
RATIOS = ["token", "sequence"]
KL_KINDS = ["k1", "k2", "k3"]
MAX_LEN = 9  # the generation budget for seq-mean-token-sum-norm (≥ T of the random batches)
POLICY_METRICS = {"tokens", "clipped_sum", "clipped_low_sum", "clipped_high_sum", "ratio_sum"}


def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=TOL, atol=TOL)


def f32(*xs):
    return [jnp.asarray(x, jnp.float32) for x in xs]


def right_padded_mask(rng, b, t, empty_row=True):
    """[b, t] masks of random lengths 1..t; row 1 is empty (all padding) when empty_row."""
    lengths = rng.integers(1, t + 1, size=b)
    if empty_row:
        lengths[1] = 0
    return (np.arange(t)[None, :] < lengths[:, None]).astype(np.float64)


def random_policy_batch(seed, b=8, t=7, empty_row=True):
    """logp, old_logp, adv [b], adv [b, t], ref_logp, is_weights, mask: float64 numpy arrays.

    Log-ratios of spread 0.3 put ρ on both sides of both clip edges; padding holds finite junk
    (the torch reference multiplies by the mask, so it cannot take -inf there).
    """
    rng = np.random.default_rng(seed)
    logp = -3.0 * rng.random((b, t))
    old = logp + 0.3 * rng.normal(size=(b, t))
    ref = logp + 0.5 * rng.normal(size=(b, t))
    is_weights = np.minimum(np.exp(0.3 * rng.normal(size=(b, t))), 1.2)  # truncated at C = 1.2
    mask = right_padded_mask(rng, b, t, empty_row)
    return logp, old, rng.normal(size=b), rng.normal(size=(b, t)), ref, is_weights, mask


# ---------------------------------------------------------------------------------------------
# References.

def ref_grpo_advantages(r, g, scale, leave_one_out):
    groups = r.reshape(-1, g)
    if leave_one_out:  # RLOO (Ahmadian et al. 2024): baseline is the mean of the other G-1
        adv = groups - (groups.sum(1, keepdims=True) - groups) / (g - 1)
    else:  # GRPO (Shao et al. 2024)
        adv = groups - groups.mean(1, keepdims=True)
    if scale == "group":
        adv = adv / (groups.std(1, ddof=1, keepdims=True) + 1e-4)
    elif scale == "batch":
        adv = adv / (r.std(ddof=1) + 1e-4)
    return adv.ravel()


def ref_kl(logp, ref, kind):
    """Schulman's estimators, as TRL writes k3: exp(ref - logp) - (ref - logp) - 1."""
    if kind == "k1":
        return logp - ref
    if kind == "k2":
        return 0.5 * (logp - ref) ** 2
    return np.exp(ref - logp) - (ref - logp) - 1


def trl_policy_loss(logp, old, adv, mask, ref, isw, *, eps, eps_high, beta, kl_kind, agg, ratio,
                    max_len):
    """trl GRPOTrainer._compute_loss (grpo / dr_grpo / bnpo losses, GSPO's sequence level)."""
    log_ratio = logp - old
    if ratio == "token":
        log_iw = log_ratio
    else:
        log_iw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
    coef_1 = torch.exp(log_iw)
    coef_2 = torch.clamp(coef_1, 1 - eps, 1 + eps_high)
    a = adv if adv.dim() == 2 else adv.unsqueeze(1)
    per_token = -torch.min(coef_1 * a, coef_2 * a)
    if isw is not None:
        per_token = per_token * isw
    metrics = {}
    if ref is not None:
        if kl_kind == "k1":
            kl = logp - ref
        elif kl_kind == "k2":
            kl = 0.5 * (logp - ref) ** 2
        else:
            kl = torch.exp(ref - logp) - (ref - logp) - 1
        per_token = per_token + beta * kl
        metrics["kl_sum"] = (kl * mask).sum()
    if agg == "token-mean":
        loss = (per_token * mask).sum() / mask.sum().clamp(min=1.0)
    elif agg == "seq-mean-token-mean":  # over the rows with a token (TRL: over all rows)
        per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
        loss = per_seq[mask.sum(-1) > 0].mean()
    else:
        loss = (per_token * mask).sum() / (per_token.size(0) * max_len)
    coef = torch.broadcast_to(coef_1, mask.shape)
    a = torch.broadcast_to(a, mask.shape)
    low = ((coef < 1 - eps) & (a < 0)).double() * mask
    high = ((coef > 1 + eps_high) & (a > 0)).double() * mask
    metrics.update(tokens=mask.sum(), clipped_low_sum=low.sum(), clipped_high_sum=high.sum(),
                   clipped_sum=(low + high).sum(), ratio_sum=(coef * mask).sum())
    return loss, metrics


def trl_value_loss(vpred, values, returns, mask, *, clip):
    """trl PPOTrainer's value loss and vf_clipfrac (here a count)."""
    vpredclipped = torch.clamp(vpred, values - clip, values + clip)
    vf_losses1 = (vpred - returns) ** 2
    vf_losses2 = (vpredclipped - returns) ** 2
    vf_loss_max = torch.max(vf_losses1, vf_losses2)
    loss = 0.5 * (vf_loss_max * mask).sum() / mask.sum()
    return loss, {"value_clipped_sum": ((vf_losses2 > vf_losses1).double() * mask).sum(),
                  "tokens": mask.sum()}


def loop_gae(r, v, m, gamma, lam):
    """A_t = Σ_{k≥t, until the mask ends} (γλ)^(k-t)·δ_k, δ_k = r_k + γ·V_{k+1}·m_{k+1} - V_k."""
    b, t = r.shape
    adv = np.zeros((b, t))
    for i in range(b):
        for s in range(t):
            if not m[i, s]:
                continue
            for k in range(s, t):
                if not m[i, k]:
                    break
                next_v = v[i, k + 1] if k + 1 < t and m[i, k + 1] else 0.0
                adv[i, s] += (gamma * lam) ** (k - s) * (r[i, k] + gamma * next_v - v[i, k])
    return adv, (adv + v) * m


def trl_masked_whiten(x, m, shift_mean=True):
    """trl.core.masked_whiten (unbiased masked variance), in numpy."""
    mean = (x * m).sum() / m.sum()
    var = (((x - mean) ** 2) * m).sum() / m.sum() * m.sum() / (m.sum() - 1)
    out = (x - mean) / np.sqrt(var + 1e-8)
    return out + mean if not shift_mean else out


def jax_policy(arrays, **kw):
    """loss, metrics and d loss / d logp of policy_loss(logp, old, adv, mask, ref, isw)."""
    logp, old, adv, mask, ref, isw = arrays
    grad_fn = jax.value_and_grad(
        lambda lp: policy_loss(lp, old, adv, mask, ref_logp=ref, is_weights=isw, **kw),
        has_aux=True)
    (loss, metrics), grad = grad_fn(logp)
    return loss, metrics, grad


# ---------------------------------------------------------------------------------------------
# grpo_advantages.

def test_grpo_advantages_by_hand():
    r = f32([1.0, 2.0, 3.0, 5.0, 5.0, 5.0])[0]
    # group 0: mean 2, std (ddof 1) sqrt((1 + 0 + 1)/2) = 1;  group 1: all equal -> 0
    adv, metrics = grpo_advantages(r, 3)
    close(adv, np.array([-1.0, 0.0, 1.0, 0, 0, 0]) / (1.0 + 1e-4))
    close(metrics["reward_std_zero_fraction"], 0.5)
    close(metrics["reward_mean"], 3.5)  # 21 / 6
    # batch deviations from 3.5: -2.5 -1.5 -0.5 1.5 1.5 1.5 -> squares sum 15.5, / 5 = 3.1
    close(metrics["reward_std"], math.sqrt(3.1))
    adv, _ = grpo_advantages(r, 3, scale="batch")
    close(adv, np.array([-1.0, 0.0, 1.0, 0, 0, 0]) / (math.sqrt(3.1) + 1e-4))
    adv, _ = grpo_advantages(r, 3, scale="none")
    close(adv, [-1.0, 0.0, 1.0, 0, 0, 0])


def test_rloo_advantages_by_hand():
    r = f32([1.0, 2.0, 6.0, 4.0, 4.0, 4.0])[0]
    # baselines (2+6)/2 = 4, (1+6)/2 = 3.5, (1+2)/2 = 1.5 -> 1-4, 2-3.5, 6-1.5
    loo = np.array([-3.0, -1.5, 4.5, 0.0, 0.0, 0.0])
    adv, metrics = grpo_advantages(r, 3, scale="none", leave_one_out=True)
    close(adv, loo)
    # group std of [1, 2, 6]: mean 3, squares 4 + 1 + 9 = 14, / 2 = 7 (of the rewards)
    adv, _ = grpo_advantages(r, 3, leave_one_out=True)
    close(adv, loo / (math.sqrt(7.0) + 1e-4))
    close(metrics["reward_std_zero_fraction"], 0.5)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("leave_one_out", [False, True])
def test_zero_variance_groups_give_exact_zeros(scale, leave_one_out):
    # 0.1 and 0.7 are inexact in binary: the group mean rounds away from its members
    r = jnp.asarray([0.1] * 3 + [0.7] * 3 + [0.0, 1.0, 1.0], jnp.float32)
    adv, metrics = grpo_advantages(r, 3, scale=scale, leave_one_out=leave_one_out)
    assert np.isfinite(np.asarray(adv)).all()
    assert (np.asarray(adv[:6]) == 0.0).all()
    assert (np.asarray(adv[6:]) != 0.0).all()
    close(metrics["reward_std_zero_fraction"], 2 / 3)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("leave_one_out", [False, True])
@pytest.mark.parametrize("g,binary", [(2, False), (4, False), (8, True), (16, True)])
def test_grpo_advantages_match_reference(scale, leave_one_out, g, binary):
    rng = np.random.default_rng(g)
    r = (rng.random(4 * g) < 0.3).astype(np.float64) if binary else 3 * rng.normal(size=4 * g)
    with jax.enable_x64(True):
        fn = jax.jit(functools.partial(grpo_advantages, group_size=g, scale=scale,
                                       leave_one_out=leave_one_out))
        adv, metrics = fn(jnp.asarray(r))
        assert adv.dtype == jnp.float64
    close(adv, ref_grpo_advantages(r, g, scale, leave_one_out))
    groups = r.reshape(-1, g)
    close(metrics["reward_std_zero_fraction"], (groups.max(1) == groups.min(1)).mean())
    close(metrics["reward_mean"], r.mean())
    close(metrics["reward_std"], r.std(ddof=1))


# ---------------------------------------------------------------------------------------------
# kl_penalty.

def test_kl_by_hand():
    logp, ref = f32([[-1.0, -2.0, -3.0]], [[-2.0, -1.0, -3.0]])
    # ref - logp = [-1, 1, 0]
    close(kl_penalty(logp, ref, "k1"), [[1.0, -1.0, 0.0]])
    close(kl_penalty(logp, ref, "k2"), [[0.5, 0.5, 0.0]])
    close(kl_penalty(logp, ref, "k3"), [[math.exp(-1.0), math.e - 2.0, 0.0]])  # e^d - d - 1
    close(kl_penalty(logp, ref), kl_penalty(logp, ref, "k3"))


@pytest.mark.parametrize("kind", KL_KINDS)
def test_kl_matches_reference(kind):
    rng = np.random.default_rng(3)
    logp = -5 * rng.random((4, 6))
    ref = logp + rng.normal(size=(4, 6)) * np.array([1e-6, 1e-3, 0.1, 1.0, 3.0, 10.0])
    with jax.enable_x64(True):
        got = kl_penalty(jnp.asarray(logp), jnp.asarray(ref), kind)
    assert got.shape == (4, 6)
    close(got, ref_kl(logp, ref, kind))
    if kind != "k1":
        assert (np.asarray(got) >= 0).all()


# ---------------------------------------------------------------------------------------------
# policy_loss by hand.

# Row 0: A = +1, mask [1, 1, 0], ρ = [1.5, 0.9] (the padding holds logp = -inf)
# Row 1: A = -2, mask [1, 1, 1], ρ = [0.5, 1.1, 2.0];  ε = 0.2: clip to [0.8, 1.2]
#   ρ = 1.5, A > 0: min(1.5, 1.2)·1 = 1.2       -> ℓ = -1.2  (clipped high)
#   ρ = 0.9:        min(0.9, 0.9)                -> ℓ = -0.9
#   ρ = 0.5, A < 0: min(-1.0, 0.8·-2 = -1.6)     -> ℓ =  1.6  (clipped low)
#   ρ = 1.1:        -2.2 both                    -> ℓ =  2.2
#   ρ = 2.0, A < 0: min(-4.0, 1.2·-2 = -2.4)     -> ℓ =  4.0  (unclipped: A < 0 above the edge)
# Σℓ = 5.7 over 5 tokens.
HAND_RHO = np.array([[1.5, 0.9, 1.0], [0.5, 1.1, 2.0]])
HAND_MASK = np.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
HAND_ADV = np.array([1.0, -2.0])
HAND_OLD = np.array([[-1.0, -2.0, -0.5], [-1.5, -0.25, -3.0]])
HAND_LOGP = np.where(HAND_MASK > 0, HAND_OLD + np.log(HAND_RHO), -np.inf)
HAND_LOSS = {
    "token-mean": 5.7 / 5,
    "seq-mean-token-mean": ((-1.2 - 0.9) / 2 + (1.6 + 2.2 + 4.0) / 3) / 2,  # (-1.05 + 2.6) / 2
    "seq-mean-token-sum-norm": 5.7 / (2 * 4),  # max_len = 4
}


def hand_inputs():
    return f32(HAND_LOGP, HAND_OLD, HAND_ADV, HAND_MASK)


@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_by_hand(agg):
    logp, old, adv, mask = hand_inputs()
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: policy_loss(lp, old, adv, mask, agg=agg, max_len=4), has_aux=True)(logp)
    assert loss.dtype == jnp.float32
    close(loss, HAND_LOSS[agg])
    assert set(metrics) == POLICY_METRICS
    close(metrics["tokens"], 5)
    close(metrics["clipped_low_sum"], 1)
    close(metrics["clipped_high_sum"], 1)
    close(metrics["clipped_sum"], 2)
    close(metrics["ratio_sum"], 1.5 + 0.9 + 0.5 + 1.1 + 2.0)
    # dℓ/dlogp = -A·ρ on unclipped tokens, 0 on clipped ones and padding (no NaN from -inf)
    dl = np.array([[0.0, -0.9, 0.0], [0.0, 2.2, 4.0]])
    weight = {"token-mean": np.full((2, 1), 1 / 5),
              "seq-mean-token-mean": np.array([[1 / 4], [1 / 6]]),  # 1/(rows · tokens of row)
              "seq-mean-token-sum-norm": np.full((2, 1), 1 / 8)}[agg]
    close(grad, dl * weight)


def test_policy_loss_clip_higher_by_hand():
    # ε_high = 0.6: ρ = 1.5 < 1.6 is no longer clipped, ℓ = -1.5: Σℓ = 5.4
    loss, metrics = policy_loss(*hand_inputs(), clip_eps_high=0.6)
    close(loss, 5.4 / 5)
    close(metrics["clipped_high_sum"], 0)
    close(metrics["clipped_low_sum"], 1)
    # ε = 0.6 on the low side too: ρ = 0.5 < 0.4 is false, ℓ = 1.0 (and 2.0 stays 4.0)
    loss, metrics = policy_loss(*hand_inputs(), clip_eps=0.6)
    close(loss, (-1.5 - 0.9 + 1.0 + 2.2 + 4.0) / 5)
    close(metrics["clipped_sum"], 0)


def test_policy_loss_is_weights_and_kl_by_hand():
    logp, old, adv, mask = hand_inputs()
    w = jnp.asarray([[0.5, 2.0, 7.0], [1.0, 1.0, 0.25]], jnp.float32)  # 7.0 is padding
    # ℓ·w = -0.6, -1.8, 1.6, 2.2, 1.0 -> Σ = 2.4
    (loss, _), grad_w = jax.value_and_grad(
        lambda w: policy_loss(logp, old, adv, mask, is_weights=w), has_aux=True)(w)
    close(loss, 2.4 / 5)
    close(grad_w, np.zeros((2, 3)))  # a correction factor, never trained
    # k1 with ref = logp - 0.1 on real tokens: 0.1 per token, β = 0.5 adds 0.05 per token
    ref = jnp.asarray(np.where(HAND_MASK > 0, HAND_LOGP - 0.1, 3.0), jnp.float32)
    loss, metrics = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_beta=0.5, kl_kind="k1")
    close(loss, 5.7 / 5 + 0.05)
    close(metrics["kl_sum"], 0.5)
    # kl_beta = 0: the KL is logged, not trained
    loss, metrics = policy_loss(logp, old, adv, mask, ref_logp=ref, kl_kind="k1")
    close(loss, 5.7 / 5)
    close(metrics["kl_sum"], 0.5)


def test_gspo_by_hand():
    logp, old, adv, mask = hand_inputs()
    # row 0: s0 = exp(mean(ln 1.5, ln 0.9)) = sqrt(1.35) ≈ 1.1619, inside [0.8, 1.2]: ℓ = -s0
    # row 1: s1 = (0.5·1.1·2.0)^(1/3) = 1.1^(1/3) ≈ 1.0323, A = -2: ℓ = 2·s1 on each token
    s0, s1 = math.sqrt(1.35), 1.1 ** (1 / 3)
    (loss, metrics), grad = jax.value_and_grad(
        lambda lp: policy_loss(lp, old, adv, mask, ratio="sequence", agg="seq-mean-token-mean"),
        has_aux=True)(logp)
    close(loss, (-s0 + 2 * s1) / 2)
    close(metrics["ratio_sum"], 2 * s0 + 3 * s1)
    close(metrics["clipped_sum"], 0)
    # d s/d logp_t = s / |y|: the gradient of the whole sequence's s, shared by its tokens
    close(grad, [[-s0 / 4, -s0 / 4, 0.0], [s1 / 3, s1 / 3, s1 / 3]])
    loss, _ = policy_loss(logp, old, adv, mask, ratio="sequence")
    close(loss, (-2 * s0 + 6 * s1) / 5)


# ---------------------------------------------------------------------------------------------
# policy_loss against the torch float64 transcription of TRL.

def assert_policy_matches(arrays, **kw):
    logp, old, adv, mask, ref, isw = arrays
    ts = {k: None if a is None else torch.tensor(a, dtype=torch.float64)
          for k, a in zip(["logp", "old", "adv", "mask", "ref", "isw"], arrays)}
    ts["logp"].requires_grad_(True)
    loss_ref, metrics_ref = trl_policy_loss(
        *ts.values(), eps=kw["clip_eps"],
        eps_high=kw["clip_eps"] if kw["clip_eps_high"] is None else kw["clip_eps_high"],
        beta=kw["kl_beta"], kl_kind=kw["kl_kind"], agg=kw["agg"], ratio=kw["ratio"],
        max_len=kw["max_len"])
    loss_ref.backward()
    with jax.enable_x64(True):
        loss, metrics, grad = jax_policy([None if a is None else jnp.asarray(a) for a in arrays],
                                         **kw)
        assert loss.dtype == jnp.float64
    close(loss, loss_ref.item())
    assert set(metrics) == set(metrics_ref)
    for k, v in metrics_ref.items():
        close(metrics[k], v.item())
    close(grad, ts["logp"].grad.numpy())


@pytest.mark.parametrize("agg,ratio,eps_high,with_is,kl_kind", list(itertools.product(
    AGGS, RATIOS, [None, 0.28], [False, True], [None, *KL_KINDS])))
def test_policy_loss_matches_reference(agg, ratio, eps_high, with_is, kl_kind):
    logp, old, adv, _, ref, isw, mask = random_policy_batch(seed=len(agg) + 7 * len(ratio))
    arrays = [logp, old, adv, mask, ref if kl_kind else None, isw if with_is else None]
    assert_policy_matches(arrays, clip_eps=0.2, clip_eps_high=eps_high,
                          kl_beta=0.04 if kl_kind else 0.0, kl_kind=kl_kind or "k3", agg=agg,
                          ratio=ratio, max_len=MAX_LEN)


@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("ratio", RATIOS)
def test_policy_loss_token_advantages_match_reference(agg, ratio):
    logp, old, _, adv, ref, isw, mask = random_policy_batch(seed=11)  # adv [B, T]
    assert_policy_matches([logp, old, adv, mask, ref, isw], clip_eps=0.1, clip_eps_high=0.3,
                          kl_beta=0.1, kl_kind="k3", agg=agg, ratio=ratio, max_len=MAX_LEN)


# ---------------------------------------------------------------------------------------------
# The micro-batch and vmap contracts.

@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("ratio", RATIOS)
def test_micro_batches_sum_to_the_full_batch(agg, ratio):
    logp, old, adv, _, ref, isw, mask = random_policy_batch(seed=5)  # row 1 is empty
    kw = dict(clip_eps=0.2, clip_eps_high=0.28, kl_beta=0.05, kl_kind="k3", agg=agg, ratio=ratio)
    with jax.enable_x64(True):
        arrays = [jnp.asarray(a) for a in (logp, old, adv, mask, ref, isw)]
        loss, metrics, grad = jax_policy(arrays, max_len=MAX_LEN, **kw)
        denominator = policy_loss_denominator(arrays[3], agg, MAX_LEN)
        parts = [jax_policy([a[i:i + 2] for a in arrays], denominator=denominator, **kw)
                 for i in range(0, 8, 2)]
        close(sum(p[0] for p in parts), loss)
        close(jnp.concatenate([p[2] for p in parts]), grad)
        for k, v in metrics.items():
            close(sum(p[1][k] for p in parts), v)


@pytest.mark.parametrize("agg", AGGS)
def test_policy_loss_vmap_over_sequences(agg):
    logp, old, adv, _, ref, isw, mask = random_policy_batch(seed=9)
    arrays = f32(logp, old, adv, mask, ref, isw)
    loss, metrics = policy_loss(*arrays[:4], ref_logp=arrays[4], is_weights=arrays[5],
                                kl_beta=0.1, agg=agg, ratio="sequence", max_len=MAX_LEN)
    denominator = policy_loss_denominator(arrays[3], agg, MAX_LEN)
    one = lambda lp, o, a, m, r, w: policy_loss(  # noqa: E731 - one sequence: [T], [T], [], [T]
        lp, o, a, m, ref_logp=r, is_weights=w, kl_beta=0.1, agg=agg, ratio="sequence",
        denominator=denominator)
    losses, per_seq = jax.vmap(one)(*arrays)
    assert losses.shape == (8,)
    close(jnp.sum(losses), loss)
    for k, v in metrics.items():
        close(jnp.sum(per_seq[k]), v)


@pytest.mark.parametrize("agg", AGGS)
def test_denominator_by_hand(agg):
    mask = jnp.asarray([[1, 1, 0], [0, 0, 0], [1, 0, 0]])
    want = {"token-mean": 3.0, "seq-mean-token-mean": 2.0,  # 2 rows have tokens
            "seq-mean-token-sum-norm": 3 * 5.0}[agg]  # B = 3, max_len = 5
    close(policy_loss_denominator(mask, agg, max_len=5), want)
    if agg != "seq-mean-token-sum-norm":  # an all-masked batch: 1, so the loss is 0, not NaN
        close(policy_loss_denominator(jnp.zeros((2, 3)), agg), 1.0)


def test_all_masked_batch_is_zero_and_finite():
    logp = jnp.full((2, 3), -jnp.inf)
    for agg in AGGS:
        for ratio in RATIOS:
            (loss, _), grad = jax.value_and_grad(
                lambda lp: policy_loss(lp, jnp.zeros((2, 3)), jnp.ones(2), jnp.zeros((2, 3)),
                                       agg=agg, ratio=ratio, max_len=3), has_aux=True)(logp)
            close(loss, 0.0)
            close(grad, np.zeros((2, 3)))


def test_garbage_padding_does_not_leak():
    logp, old, adv, _, ref, isw, mask = random_policy_batch(seed=2)
    pad = mask == 0
    clean = f32(logp, old, adv, mask, ref, isw)
    dirty = f32(np.where(pad, -np.inf, logp), np.where(pad, np.nan, old), adv, mask,
                np.where(pad, np.inf, ref), np.where(pad, np.nan, isw))
    for ratio in RATIOS:
        kw = dict(kl_beta=0.1, ratio=ratio, agg="seq-mean-token-mean")
        want = jax_policy(clean, **kw)
        got = jax_policy(dirty, **kw)
        close(got[0], want[0])
        close(got[2], want[2])
        for k in want[1]:
            close(got[1][k], want[1][k])


def test_policy_loss_jit_and_traced_hyper_parameters():
    logp, old, adv, _, ref, isw, mask = f32(*random_policy_batch(seed=4))
    kw = dict(agg="seq-mean-token-sum-norm", ratio="sequence", max_len=MAX_LEN, kl_kind="k2")
    eager, _ = policy_loss(logp, old, adv, mask, ref_logp=ref, is_weights=isw, clip_eps=0.1,
                           clip_eps_high=0.3, kl_beta=0.2, **kw)
    jitted = jax.jit(lambda e, eh, b, *a: policy_loss(
        *a[:4], ref_logp=a[4], is_weights=a[5], clip_eps=e, clip_eps_high=eh, kl_beta=b, **kw))
    close(jitted(0.1, 0.3, 0.2, logp, old, adv, mask, ref, isw)[0], eager)


def test_bfloat16_inputs_are_promoted_to_float32():
    logp, old, adv, mask = (jnp.asarray(a, jnp.bfloat16) for a in hand_inputs())
    loss, metrics = policy_loss(logp, old, adv, mask)
    assert loss.dtype == jnp.float32 and metrics["ratio_sum"].dtype == jnp.float32
    assert grpo_advantages(adv, 2)[0].dtype == jnp.float32
    assert kl_penalty(logp, old).dtype == jnp.float32
    assert all(x.dtype == jnp.float32 for x in gae(logp, old, mask))
    assert value_loss(logp, old, old, mask)[0].dtype == jnp.float32
    assert whiten(logp, mask).dtype == jnp.float32


# ---------------------------------------------------------------------------------------------
# gae.

def test_gae_by_hand():
    r = [[0.0, 0.0, 1.0], [1.0, 2.0, 9.0]]
    v = [[0.5, 0.25, 0.5], [1.0, 1.0, 7.0]]
    m = [[1, 1, 1], [1, 1, 0]]
    adv, ret = gae(*f32(r, v), jnp.asarray(m), gamma=1.0, lam=0.5)
    # row 0: δ2 = 1 + 0 - 0.5 = 0.5 -> A2 = 0.5;  δ1 = 0 + 0.5 - 0.25 = 0.25 -> A1 = 0.25 + 0.25
    #        δ0 = 0 + 0.25 - 0.5 = -0.25 -> A0 = -0.25 + 0.5·0.5 = 0
    # row 1 (t = 2 is padding): δ1 = 2 + 0 - 1 = 1 -> A1 = 1;  δ0 = 1 + 1 - 1 = 1 -> A0 = 1.5
    close(adv, [[0.0, 0.5, 0.5], [1.5, 1.0, 0.0]])
    close(ret, [[0.5, 0.75, 1.0], [2.5, 2.0, 0.0]])


@pytest.mark.parametrize("gamma,lam", [(1.0, 0.95), (0.9, 0.8), (0.99, 1.0), (0.5, 0.0)])
def test_gae_matches_loop(gamma, lam):
    rng = np.random.default_rng(7)
    r, v = rng.normal(size=(5, 8)), rng.normal(size=(5, 8))
    m = right_padded_mask(rng, 5, 8)
    with jax.enable_x64(True):
        adv, ret = jax.jit(functools.partial(gae, gamma=gamma, lam=lam))(
            jnp.asarray(r), jnp.asarray(v), jnp.asarray(m))
    adv_ref, ret_ref = loop_gae(r, v, m, gamma, lam)
    close(adv, adv_ref)
    close(ret, ret_ref)


def test_gae_mask_with_holes_follows_the_formula():
    # Not the right-padded layout gae is meant for, but the formula still defines the result:
    # m_{t+1} = 0 cuts the bootstrap and the recursion at every hole, as the loop's `break` does.
    rng = np.random.default_rng(12)
    r, v = rng.normal(size=(4, 8)), rng.normal(size=(4, 8))
    m = (rng.random((4, 8)) < 0.6).astype(np.float64)
    with jax.enable_x64(True):
        adv, ret = gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma=0.9, lam=0.7)
    adv_ref, ret_ref = loop_gae(r, v, m, 0.9, 0.7)
    close(adv, adv_ref)
    close(ret, ret_ref)


def test_gae_gamma_lam_one_returns_reward_to_go():
    rng = np.random.default_rng(8)
    r, v = rng.normal(size=(4, 6)), 100 * rng.normal(size=(4, 6))
    m = right_padded_mask(rng, 4, 6)
    with jax.enable_x64(True):
        _, ret = gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(m), gamma=1.0, lam=1.0)
    to_go = np.cumsum((r * m)[:, ::-1], axis=1)[:, ::-1] * m  # the values telescope away
    close(ret, to_go)


def test_gae_garbage_padding_and_vmap():
    rng = np.random.default_rng(6)
    r, v = rng.normal(size=(3, 5)), rng.normal(size=(3, 5))
    m = right_padded_mask(rng, 3, 5)
    want = gae(*f32(r, v), jnp.asarray(m))
    dirty = gae(*f32(np.where(m > 0, r, np.nan), np.where(m > 0, v, np.inf)), jnp.asarray(m))
    per_row = jax.vmap(gae)(*f32(r, v), jnp.asarray(m))  # [T] rows
    for got in (dirty, per_row):
        close(got[0], want[0])
        close(got[1], want[1])


# ---------------------------------------------------------------------------------------------
# value_loss.

def test_value_loss_by_hand():
    v, old, ret = f32([[1.0, 1.6, 5.0]], [[1.5, 1.5, 0.0]], [[0.0, 3.0, 0.0]])
    mask = jnp.asarray([[1, 1, 0]])
    # t0: (1 - 0)² = 1;  clip(1, 1.3, 1.7) = 1.3 -> 1.69: the clipped term is larger
    # t1: (1.6 - 3)² = 1.96, 1.6 is inside [1.3, 1.7]: equal, not counted
    loss, metrics = value_loss(v, old, ret, mask)
    close(loss, 0.5 * (1.69 + 1.96) / 2)
    close(metrics["value_clipped_sum"], 1)
    close(metrics["tokens"], 2)
    close(value_loss(v, old, ret, mask, denominator=4.0)[0], 0.5 * (1.69 + 1.96) / 4)


@pytest.mark.parametrize("clip", [0.05, 0.2, 10.0])
def test_value_loss_matches_reference(clip):
    rng = np.random.default_rng(int(clip * 100))
    old = rng.normal(size=(6, 7))
    v, ret = old + 0.3 * rng.normal(size=(6, 7)), rng.normal(size=(6, 7))
    m = right_padded_mask(rng, 6, 7, empty_row=False)
    ts = [torch.tensor(a, dtype=torch.float64) for a in (v, old, ret, m)]
    ts[0].requires_grad_(True)
    loss_ref, metrics_ref = trl_value_loss(*ts, clip=clip)
    loss_ref.backward()
    with jax.enable_x64(True):
        (loss, metrics), grad = jax.value_and_grad(
            lambda x: value_loss(x, *map(jnp.asarray, (old, ret, m)), clip=clip),
            has_aux=True)(jnp.asarray(v))
    close(loss, loss_ref.item())
    close(grad, ts[0].grad.numpy())
    for k, val in metrics_ref.items():
        close(metrics[k], val.item())
    # micro-batches of 2 rows with the full token count sum to the full loss
    den = policy_loss_denominator(jnp.asarray(m))
    with jax.enable_x64(True):
        parts = [value_loss(*(jnp.asarray(a[i:i + 2]) for a in (v, old, ret, m)), clip=clip,
                            denominator=den)[0] for i in range(0, 6, 2)]
        close(sum(parts), loss)


# ---------------------------------------------------------------------------------------------
# whiten.

def test_whiten_by_hand():
    x, mask = f32([1.0, 2.0, 3.0, 100.0])[0], jnp.asarray([1, 1, 1, 0])
    # mean 2, unbiased variance (1 + 0 + 1) / 2 = 1; padding -> 0
    close(whiten(x, mask), np.array([-1.0, 0.0, 1.0, 0.0]) / math.sqrt(1 + 1e-8))
    close(whiten(x, mask, shift_mean=False),
          np.array([-1.0, 0.0, 1.0, 0.0]) / math.sqrt(1 + 1e-8) + [2.0, 2.0, 2.0, 0.0])
    close(whiten(x, jnp.asarray([0, 1, 0, 0])), [0.0, 0.0, 0.0, 0.0])  # one element: var 0


@pytest.mark.parametrize("shift_mean", [True, False])
def test_whiten_matches_reference(shift_mean):
    rng = np.random.default_rng(10)
    x = 5 + 3 * rng.normal(size=(4, 9))
    m = right_padded_mask(rng, 4, 9)
    with jax.enable_x64(True):
        got = whiten(jnp.asarray(x), jnp.asarray(m), shift_mean=shift_mean)
    close(got, trl_masked_whiten(x, m, shift_mean) * m)
    if shift_mean:
        close(np.sum(np.asarray(got) * m) / m.sum(), 0.0)


# ---------------------------------------------------------------------------------------------
# Argument checks.

@pytest.mark.parametrize("args,kw,match", [
    ((np.ones(7), 3), {}, "do not split"),
    ((np.ones(6), 1), {}, "group_size must be >= 2"),
    ((np.ones(6), 1), dict(scale="none", leave_one_out=True), "group_size must be >= 2"),
    ((np.ones(6), 0), {}, "positive int"),
    ((np.ones(6), 3), dict(scale="prompt"), "group, batch, none"),
    ((np.ones((2, 3)), 3), {}, "1-D"),
    ((np.ones(1), 1), dict(scale="batch"), "at least 2"),
])
def test_grpo_advantages_rejects_bad_arguments(args, kw, match):
    with pytest.raises(ValueError, match=match):
        grpo_advantages(*args, **kw)


def test_grpo_advantages_group_of_one_unscaled_is_zero():
    adv, _ = grpo_advantages(jnp.asarray([1.0, 2.0]), 1, scale="none")
    close(adv, [0.0, 0.0])


@pytest.mark.parametrize("kw,match", [
    (dict(agg="sum"), "token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"),
    (dict(ratio="geo"), "token, sequence"),
    (dict(kl_kind="k4"), "k1, k2, k3"),
    (dict(agg="seq-mean-token-sum-norm"), "needs max_len"),
    (dict(agg="seq-mean-token-sum-norm", max_len=0), "positive int"),
    (dict(kl_beta=0.1), "needs ref_logp"),
    (dict(clip_eps=-0.1), "clip_eps must be >= 0"),
    (dict(clip_eps_high=-0.1), "clip_eps_high must be >= 0"),
])
def test_policy_loss_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        policy_loss(*hand_inputs(), **kw)


def test_other_argument_checks():
    logp, old, _, mask = hand_inputs()
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_penalty(logp, old, "k5")
    with pytest.raises(ValueError, match="needs max_len"):
        policy_loss_denominator(mask, "seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="one shape"):
        policy_loss(logp, old[:, :2], jnp.ones(2), mask)
    with pytest.raises(ValueError, match="clip must be >= 0"):
        value_loss(logp, old, old, mask, clip=-1.0)
    # sum-norm with a denominator needs no max_len
    loss, _ = policy_loss(*hand_inputs(), agg="seq-mean-token-sum-norm", denominator=8.0)
    close(loss, HAND_LOSS["seq-mean-token-sum-norm"])
