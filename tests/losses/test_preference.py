"""hone.losses.preference: hand-computed values, parity with float64 transcriptions of the published
formulas, extreme inputs, and the per-example vmap contract.

The tolerance is 1e-6 (relative and absolute) everywhere and is never loosened. The references are
TRL's code for each loss transcribed into torch float64 (autograd gives their gradients), and
mpmath at 60 digits where float64 itself is not exact enough (ORPO as log-probs approach 0).
Parity checks run jax with jax_enable_x64 so that they test the formulas, not float32 rounding;
hand-computed values and extreme inputs are also checked in float32, the dtype training uses.
"""

import functools
import math

import jax
import jax.numpy as jnp
import mpmath
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.losses import dpo_loss, orpo_loss, reward_loss, sequence_logprobs, simpo_loss

TOL = 1e-6  # fixed; never loosened
DPO_VARIANTS = [("sigmoid", 0.0), ("sigmoid", 0.1), ("ipo", 0.0), ("hinge", 0.0), ("robust", 0.1)]
PROPERTY = settings(max_examples=40, deadline=None, derandomize=True)
BETAS = st.one_of(st.sampled_from([1e-3, 100.0]), st.floats(1e-3, 100.0))


def close(actual, expected):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=TOL, atol=TOL)


def softplus(x: float) -> float:
    """log(1 + e^x) = -logσ(-x), for the hand computations."""
    return math.log1p(math.exp(x))


def f32(*xs):
    return [jnp.asarray(x, jnp.float32) for x in xs]


# ---------------------------------------------------------------------------------------------
# References: TRL's code, transcribed into torch float64.

def trl_dpo(pc, pr, rc, rr, *, beta, loss_type, label_smoothing):
    """trl DPOTrainer.dpo_loss: the sigmoid, robust, hinge and ipo branches."""
    logits = (pc - pr) - (rc - rr)  # pi_logratios - ref_logratios
    ls = label_smoothing
    if loss_type == "sigmoid":
        losses = -F.logsigmoid(beta * logits) * (1 - ls) - F.logsigmoid(-beta * logits) * ls
    elif loss_type == "robust":
        losses = (-F.logsigmoid(beta * logits) * (1 - ls)
                  + F.logsigmoid(-beta * logits) * ls) / (1 - 2 * ls)
    elif loss_type == "hinge":
        losses = torch.relu(1 - beta * logits)
    else:  # ipo
        losses = (logits - 1 / (2 * beta)) ** 2
    chosen_rewards = beta * (pc - rc).detach()
    rejected_rewards = beta * (pr - rr).detach()
    return losses.mean(), {
        "rewards_chosen": chosen_rewards.mean(), "rewards_rejected": rejected_rewards.mean(),
        "margin": (chosen_rewards - rejected_rewards).mean(),
        "accuracy": (chosen_rewards > rejected_rewards).double().mean()}


def trl_simpo(c, r, *, beta, gamma):
    """trl CPOTrainer.cpo_loss with loss_type="simpo", no label smoothing."""
    logits = c - r
    gamma_logratios = gamma / beta
    logits = logits - gamma_logratios
    losses = -F.logsigmoid(beta * logits)
    chosen_rewards, rejected_rewards = beta * c.detach(), beta * r.detach()
    return losses.mean(), {
        "rewards_chosen": chosen_rewards.mean(), "rewards_rejected": rejected_rewards.mean(),
        "margin": (chosen_rewards - rejected_rewards).mean(),
        "accuracy": (chosen_rewards > rejected_rewards).double().mean()}


def trl_orpo(c, r, nll, *, beta):
    """trl ORPOTrainer.odds_ratio_loss, and its loss = policy_nll_loss - losses.mean()."""
    log_odds = (c - r) - (torch.log1p(-torch.exp(c)) - torch.log1p(-torch.exp(r)))
    ratio = F.logsigmoid(log_odds)
    losses = beta * ratio
    return nll.mean() - losses.mean(), {
        "nll": nll.mean(), "log_odds_ratio": ratio.mean(), "log_odds_chosen": log_odds.mean(),
        "accuracy": (c > r).double().mean()}


def trl_reward(chosen, rejected, *, margin=None, center_coef=0.0):
    """trl RewardTrainer.compute_loss."""
    if margin is None:
        loss = -F.logsigmoid(chosen - rejected).mean()
    else:
        margin = torch.as_tensor(margin, dtype=torch.float64)
        loss = -F.logsigmoid(chosen - rejected - margin).mean()
    loss = loss + center_coef * torch.mean((chosen + rejected) ** 2)
    return loss, {"accuracy": (chosen > rejected).double().mean(),
                  "margin": (chosen - rejected).mean(),
                  "reward_mean": torch.cat([chosen, rejected]).mean()}


def torch_run(ref, arrays, **kw):
    ts = [torch.tensor(np.asarray(a, np.float64), requires_grad=True) for a in arrays]
    loss, metrics = ref(*ts, **kw)
    loss.backward()
    return loss.item(), {k: v.item() for k, v in metrics.items()}, [t.grad.numpy() for t in ts]


def jax_run(fn, arrays, **kw):
    grad_fn = jax.value_and_grad(lambda *a: fn(*a, **kw), argnums=tuple(range(len(arrays))),
                                 has_aux=True)
    (loss, metrics), grads = grad_fn(*[jnp.asarray(a) for a in arrays])
    return loss, metrics, grads


def assert_matches(fn, ref, arrays, **kw):
    """Loss, every metric and the gradient of every input agree with the torch float64 reference."""
    loss_ref, metrics_ref, grads_ref = torch_run(ref, arrays, **kw)
    with jax.enable_x64(True):
        loss, metrics, grads = jax_run(fn, [np.asarray(a, np.float64) for a in arrays], **kw)
        assert loss.dtype == jnp.float64
    close(loss, loss_ref)
    assert set(metrics) == set(metrics_ref)
    for k in metrics_ref:
        close(metrics[k], metrics_ref[k])
    for g, g_ref in zip(grads, grads_ref):
        close(g, g_ref)


# ---------------------------------------------------------------------------------------------
# Hand-computed values (float32, the training dtype).

def test_sequence_logprobs_by_hand():
    logps = np.array([[-1.0, -2.0, -3.0, -np.inf],   # padding may hold anything, even -inf
                      [-0.5, -0.25, -4.0, -8.0],
                      [-1.0, -1.0, -1.0, -1.0]])
    mask = np.array([[1, 1, 0, 0],
                     [0, 1, 1, 1],
                     [0, 0, 0, 0]])  # an empty completion
    # sums: -1 - 2 = -3;  -0.25 - 4 - 8 = -12.25;  0
    close(sequence_logprobs(*f32(logps), mask), [-3.0, -12.25, 0.0])
    # means: -3/2;  -12.25/3;  0 (divided by max(count, 1))
    close(sequence_logprobs(*f32(logps), mask, average=True), [-1.5, -12.25 / 3, 0.0])
    # the gradient is the mask (over the count when averaging): -inf padding leaks no NaN
    grad = jax.grad(lambda x: jnp.sum(sequence_logprobs(x, mask, average=True)))(*f32(logps))
    close(grad, mask / np.maximum(mask.sum(1, keepdims=True), 1))


# Two examples, beta = 0.5:
#   example 0: pc - rc = -1 - (-2) = 1,  pr - rr = -3 - (-2) = -1,  d = 2,   βd = 1
#   example 1: pc - rc = -2 - (-2) = 0,  pr - rr = -1 - (-2) = 1,   d = -1,  βd = -0.5
HAND_DPO = dict(pc=[-1.0, -2.0], pr=[-3.0, -1.0], rc=[-2.0, -2.0], rr=[-2.0, -2.0])
# With -logσ(x) = softplus(-x) and logσ(-x) = -softplus(x):
HAND_DPO_LOSS = {
    # mean of -logσ(βd):  (softplus(-1) + softplus(0.5)) / 2 = (0.313262 + 0.974077) / 2
    ("sigmoid", 0.0): (softplus(-1.0) + softplus(0.5)) / 2,
    # conservative, ε = 0.25: per example 0.75·softplus(-βd) + 0.25·softplus(βd)
    ("sigmoid", 0.25): ((0.75 * softplus(-1.0) + 0.25 * softplus(1.0))
                        + (0.75 * softplus(0.5) + 0.25 * softplus(-0.5))) / 2,
    # 1/(2β) = 1:  ((2 - 1)² + (-1 - 1)²) / 2 = (1 + 4) / 2
    ("ipo", 0.0): 2.5,
    # relu(1 - 1) = 0, relu(1 + 0.5) = 1.5;  mean 0.75
    ("hinge", 0.0): 0.75,
    # robust, ε = 0.25: per example (0.75·softplus(-βd) - 0.25·softplus(βd)) / (1 - 0.5)
    ("robust", 0.25): ((0.75 * softplus(-1.0) - 0.25 * softplus(1.0))
                       + (0.75 * softplus(0.5) - 0.25 * softplus(-0.5))) / 2 / 0.5,
}


@pytest.mark.parametrize("loss_type,eps", list(HAND_DPO_LOSS))
def test_dpo_by_hand(loss_type, eps):
    inputs = dict(zip(HAND_DPO, f32(*HAND_DPO.values())))
    loss, metrics = dpo_loss(**inputs, beta=0.5, loss_type=loss_type, label_smoothing=eps)
    assert loss.dtype == jnp.float32
    close(loss, HAND_DPO_LOSS[loss_type, eps])
    # rewards β(pc - rc) = [0.5, 0], β(pr - rr) = [-0.5, 0.5]: means 0.25 and 0, margin 0.25;
    # example 0 prefers chosen (0.5 > -0.5), example 1 does not (0 < 0.5): accuracy 0.5
    close(metrics["rewards_chosen"], 0.25)
    close(metrics["rewards_rejected"], 0.0)
    close(metrics["margin"], 0.25)
    close(metrics["accuracy"], 0.5)


def test_dpo_exact_value():
    # β = 1, d = ±ln 3: σ(ln 3) = 3/4, σ(-ln 3) = 1/4,
    # so the loss is (ln(4/3) + ln 4)/2 = ln(16/3)/2
    ln3 = math.log(3.0)
    loss, _ = dpo_loss(*f32([-1.0, -1.0], [-2.0, -2.0], [-1.0 - ln3, -1.0 + ln3], [-2.0, -2.0]),
                       beta=1.0)
    close(loss, math.log(16 / 3) / 2)


def test_simpo_by_hand():
    # β = 2, γ = 0.5:  β(c - r) - γ = 2·1 - 0.5 = 1.5  and  2·(-0.5) - 0.5 = -1.5
    loss, metrics = simpo_loss(*f32([-1.0, -2.0], [-2.0, -1.5]))
    close(loss, (softplus(-1.5) + softplus(1.5)) / 2)
    close(metrics["rewards_chosen"], -3.0)      # 2 · mean(-1, -2)
    close(metrics["rewards_rejected"], -3.5)    # 2 · mean(-2, -1.5)
    close(metrics["margin"], 0.5)
    close(metrics["accuracy"], 0.5)             # -1 > -2 yes, -2 > -1.5 no


def test_orpo_by_hand():
    # p = 1/2 has odds 1 (log 0); p = 1/4 has odds 1/3 (log -ln 3).
    #   example 0: c = ln 1/2, r = ln 1/4 -> log odds ratio = 0 - (-ln 3) = ln 3,  logσ = ln(3/4)
    #   example 1: c = ln 1/4, r = ln 1/2 -> log odds ratio = -ln 3,               logσ = ln(1/4)
    # nll = [1, 3], β = 0.1:  loss = 2 - 0.1 · (ln(3/4) + ln(1/4)) / 2 = 2 - 0.05 · ln(3/16)
    half, quarter = math.log(0.5), math.log(0.25)
    loss, metrics = orpo_loss(*f32([half, quarter], [quarter, half], [1.0, 3.0]), beta=0.1)
    close(loss, 2.0 - 0.05 * math.log(3 / 16))
    close(metrics["nll"], 2.0)
    close(metrics["log_odds_ratio"], math.log(3 / 16) / 2)
    close(metrics["log_odds_chosen"], 0.0)
    close(metrics["accuracy"], 0.5)


def test_reward_by_hand():
    chosen, rejected = f32([2.0, 0.0], [1.0, 1.0])
    # gaps [1, -1]: (softplus(-1) + softplus(1)) / 2;  centring: mean((3², 1²)) = 5, times 0.1
    loss, metrics = reward_loss(chosen, rejected, center_coef=0.1)
    close(loss, (softplus(-1.0) + softplus(1.0)) / 2 + 0.5)
    close(metrics["accuracy"], 0.5)
    close(metrics["margin"], 0.0)        # mean(1, -1)
    close(metrics["reward_mean"], 1.0)   # (2 + 0 + 1 + 1) / 4
    # per-example margins [1, -1] cancel the gaps: -logσ(0) = ln 2 each
    loss, _ = reward_loss(chosen, rejected, margin=jnp.array([1.0, -1.0]), center_coef=0.1)
    close(loss, math.log(2.0) + 0.5)
    # a scalar margin 0.5: logits [0.5, -1.5]; no centring
    loss, _ = reward_loss(chosen, rejected, margin=0.5)
    close(loss, (softplus(-0.5) + softplus(1.5)) / 2)


# ---------------------------------------------------------------------------------------------
# Parity with the references on random inputs (float64).

@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 7]),
       variant=st.sampled_from(["sigmoid", "ipo", "hinge", "robust"]), beta=BETAS,
       scale=st.sampled_from([1.0, 30.0, 1e4]), eps=st.floats(0.0, 0.49))
def test_dpo_matches_reference(seed, b, variant, beta, scale, eps):
    rng = np.random.default_rng(seed)
    arrays = [-scale * rng.random(b) for _ in range(4)]  # scale 1e4 and β up to 100: |βd| to ~1e6
    eps = eps if variant in ("sigmoid", "robust") else 0.0
    assert_matches(dpo_loss, trl_dpo, arrays, beta=beta, loss_type=variant, label_smoothing=eps)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 7]), beta=BETAS,
       gamma=st.floats(0.0, 5.0), scale=st.sampled_from([1.0, 30.0]))
def test_simpo_matches_reference(seed, b, beta, gamma, scale):
    rng = np.random.default_rng(seed)
    arrays = [-scale * rng.random(b) for _ in range(2)]
    assert_matches(simpo_loss, trl_simpo, arrays, beta=beta, gamma=gamma)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 7]), beta=BETAS,
       scale=st.sampled_from([0.1, 3.0, 30.0]))
def test_orpo_matches_reference(seed, b, beta, scale):
    rng = np.random.default_rng(seed)
    # length-averaged log-probs in [-scale, -1e-4): away from 0, where TRL's form loses digits
    c, r = (-1e-4 - scale * rng.random(b) for _ in range(2))
    assert_matches(orpo_loss, trl_orpo, [c, r, 5 * rng.random(b)], beta=beta)


@PROPERTY
@given(seed=st.integers(0, 2**32 - 1), b=st.sampled_from([1, 7]),
       margin=st.sampled_from(["none", "scalar", "per-example"]), center_coef=st.floats(0.0, 1.0),
       scale=st.sampled_from([1.0, 30.0, 1e3]))
def test_reward_matches_reference(seed, b, margin, center_coef, scale):
    rng = np.random.default_rng(seed)
    chosen, rejected = (scale * rng.normal(size=b) for _ in range(2))
    m = {"none": None, "scalar": float(rng.random()), "per-example": rng.random(b)}[margin]
    assert_matches(reward_loss, trl_reward, [chosen, rejected], margin=m, center_coef=center_coef)


def test_sequence_logprobs_matches_numpy():
    rng = np.random.default_rng(0)
    logps = -5 * rng.random((4, 9))
    mask = rng.random((4, 9)) < 0.6
    with jax.enable_x64(True):
        total = sequence_logprobs(jnp.asarray(logps), mask)
        mean = sequence_logprobs(jnp.asarray(logps), mask, average=True)
    close(total, (logps * mask).sum(1))
    close(mean, (logps * mask).sum(1) / np.maximum(mask.sum(1), 1))


# ---------------------------------------------------------------------------------------------
# Extremes.

# |βd| = 1e3 needs d = 1e3/β: (β, d) pairs, d exact in float32
LARGE = [(1e-3, 1e6), (0.1, 1e4), (100.0, 10.0)]


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
@pytest.mark.parametrize("beta,d", LARGE)
@pytest.mark.parametrize("sign", [1.0, -1.0])
@pytest.mark.parametrize("loss_type,eps", DPO_VARIANTS)
def test_dpo_large_margins(dtype, beta, d, sign, loss_type, eps):
    pc = np.array([-10.0, -20.0])
    arrays = [pc, np.array([-3.0, -4.0]), pc - sign * d, np.array([-3.0, -4.0])]  # βd = ±1e3
    kw = dict(beta=beta, loss_type=loss_type, label_smoothing=eps)
    loss_ref, _, grads_ref = torch_run(trl_dpo, arrays, **kw)
    with jax.enable_x64(dtype == jnp.float64):
        loss, _, grads = jax_run(dpo_loss, [jnp.asarray(a, dtype) for a in arrays], **kw)
        assert loss.dtype == dtype
    assert np.isfinite(loss) and all(np.isfinite(g).all() for g in grads)
    close(loss, loss_ref)  # e.g. sigmoid at βd = -1e3 is exactly 1e3, at +1e3 exactly 0
    for g, g_ref in zip(grads, grads_ref):
        close(g, g_ref)


def mp_log1m_exp(x):
    return mpmath.log(-mpmath.expm1(x))  # expm1 keeps every digit as x -> 0


def mp_orpo(c: float, r: float, nll: float, beta: float):
    """One example's ORPO loss, log odds ratio and d loss/dc, d loss/dr, at 60 digits."""
    with mpmath.workdps(60):
        c, r = mpmath.mpf(c), mpmath.mpf(r)
        log_odds = (c - r) - (mp_log1m_exp(c) - mp_log1m_exp(r))
        sigma_neg = 1 / (1 + mpmath.exp(log_odds))  # σ(-log_odds) = -d logσ / d log_odds
        loss = nll + beta * mpmath.log1p(mpmath.exp(-log_odds))
        # d log_odds/dc = 1/(1 - e^c),  d log_odds/dr = -1/(1 - e^r)
        dc = -beta * sigma_neg / -mpmath.expm1(c)
        dr = beta * sigma_neg / -mpmath.expm1(r)
        return [float(v) for v in (loss, log_odds, dc, dr)]


# (chosen, rejected) log-probs approaching 0 from below, on both sides of the -ln 2 branch switch
NEAR_ZERO = [(-1e-3, -0.7), (-1e-6, -2.0), (-1e-9, -0.69), (-1e-12, -1e-3), (-1e-15, -5.0),
             (-1e-30, -0.5), (-1e-300, -0.7), (-0.7, -1e-8), (-3.0, -1e-15), (-1e-10, -1e-11),
             (-40.0, -1e-20)]


def orpo_per_example(c, r, nll, beta):
    """vmapped (loss, log_odds, dloss/dc, dloss/dr) for each example called as scalars."""
    f = jax.value_and_grad(lambda c, r, n: orpo_loss(c, r, n, beta=beta), argnums=(0, 1),
                           has_aux=True)
    (loss, metrics), (dc, dr) = jax.vmap(f)(c, r, nll)
    return loss, metrics["log_odds_chosen"], dc, dr


def test_orpo_near_zero_float64():
    c, r = (np.array(v) for v in zip(*NEAR_ZERO))
    nll = np.linspace(0.5, 2.0, len(c))
    with jax.enable_x64(True):
        got = orpo_per_example(*(jnp.asarray(v, jnp.float64) for v in (c, r, nll)), 0.1)
        batch_loss, _ = orpo_loss(*(jnp.asarray(v, jnp.float64) for v in (c, r, nll)), beta=0.1)
    want = np.array([mp_orpo(*args, 0.1) for args in zip(c, r, nll)])  # [N, 4]
    for k in range(4):
        close(got[k], want[:, k])
    close(batch_loss, want[:, 0].mean())


def test_orpo_near_zero_float32():
    c = np.array([-1e-3, -1e-5, -1e-7, -1e-20, -1e-37], np.float32)  # -1e-37 is still normal
    r = np.full_like(c, -0.7)
    nll = np.ones_like(c)
    loss, log_odds, _, _ = orpo_per_example(*f32(c, r, nll), 0.1)
    want = np.array([mp_orpo(float(a), float(b), 1.0, 0.1) for a, b in zip(c, r)])
    close(log_odds, want[:, 1])
    close(loss, want[:, 0])


def test_orpo_at_and_above_zero_is_finite():
    # A log-prob of exactly 0 (an empty completion's average), a subnormal, and a rounding error
    # above 0 would give log(1 - e^0) = -inf; all stay finite, gradients included.
    edge = [0.0, -1e-45, -1e-38, -1e-30, -1e-7, 1e-7, -80.0, -1e3]
    c, r = (np.array(v, np.float32) for v in zip(*[(a, b) for a in edge for b in edge]))
    for dtype in (jnp.float32, jnp.float64):
        with jax.enable_x64(dtype == jnp.float64):
            loss, log_odds, dc, dr = orpo_per_example(*(jnp.asarray(v, dtype)
                                                        for v in (c, r, np.ones_like(c))), 0.1)
            batch, metrics = orpo_loss(*(jnp.asarray(v, dtype) for v in (c, r, np.ones_like(c))))
        for v in (loss, log_odds, dc, dr, batch, *metrics.values()):
            assert np.isfinite(np.asarray(v)).all()


def test_gradients_finite_at_extremes():
    big = np.array([1e4, -1e4, 0.0, 3e4], np.float32)
    small = np.array([-1e4, 1e4, 0.0, -3e4], np.float32)
    cases = [
        (functools.partial(simpo_loss, beta=100.0, gamma=0.5), (big - 1e5, small - 1e5)),
        (functools.partial(simpo_loss, beta=1e-3), (big - 1e5, small - 1e5)),
        (functools.partial(reward_loss, center_coef=0.1), (big, small + 5e3)),  # sums ±5e3, 5e3
        (functools.partial(reward_loss, margin=1e4), (big, small)),
        *[(functools.partial(dpo_loss, beta=100.0, loss_type=t, label_smoothing=e),
           (big - 1e5, small - 1e5, small - 1e5, big - 1e5)) for t, e in DPO_VARIANTS],
    ]
    for fn, arrays in cases:
        loss, metrics, grads = jax_run(fn, f32(*arrays))
        assert np.isfinite(loss), fn
        assert all(np.isfinite(g).all() for g in grads), fn
        assert all(np.isfinite(v) for v in metrics.values()), fn


# ---------------------------------------------------------------------------------------------
# The per-example contract: vmap over examples, then the mean, equals the batch call.

def _random_inputs(n, b=6, seed=0):
    rng = np.random.default_rng(seed)
    return [-(0.01 + 3 * rng.random(b)) for _ in range(n)]


VMAP_CASES = {
    **{f"dpo-{t}-{e}": (functools.partial(dpo_loss, beta=0.7, loss_type=t, label_smoothing=e), 4)
       for t, e in DPO_VARIANTS},
    "simpo": (functools.partial(simpo_loss, beta=2.5, gamma=0.3), 2),
    "orpo": (functools.partial(orpo_loss, beta=0.2), 3),
    "reward": (functools.partial(reward_loss, center_coef=0.1), 2),
    "reward-scalar-margin": (functools.partial(reward_loss, margin=0.3, center_coef=0.05), 2),
    "reward-per-example-margin": (
        lambda c, r, m: reward_loss(c, r, margin=m, center_coef=0.05), 3),
}


@pytest.mark.parametrize("name", list(VMAP_CASES))
def test_vmap_per_example_equals_batch(name):
    fn, n = VMAP_CASES[name]
    arrays = f32(*_random_inputs(n))
    losses, per_example = jax.vmap(fn)(*arrays)
    assert losses.shape == (6,)
    loss, metrics = fn(*arrays)
    close(jnp.mean(losses), loss)
    assert set(per_example) == set(metrics)
    for k, v in metrics.items():
        close(jnp.mean(per_example[k]), v)


@pytest.mark.parametrize("average", [False, True])
def test_sequence_logprobs_vmap(average):
    rng = np.random.default_rng(1)
    logps, mask = -3 * rng.random((5, 7)), rng.random((5, 7)) < 0.5
    per_row = jax.vmap(lambda x, m: sequence_logprobs(x, m, average=average))(*f32(logps), mask)
    assert per_row.shape == (5,)
    close(per_row, sequence_logprobs(*f32(logps), mask, average=average))


# ---------------------------------------------------------------------------------------------
# Dtypes, jit, and argument checks.

def test_jit_and_traced_beta():
    arrays = f32(*_random_inputs(4))
    eager, _ = dpo_loss(*arrays, beta=0.3, loss_type="robust", label_smoothing=0.2)
    jitted = jax.jit(functools.partial(dpo_loss, loss_type="robust", label_smoothing=0.2))
    close(jitted(*arrays, beta=0.3)[0], eager)  # beta traced: only Python numbers are checked
    traced, _ = jax.jit(lambda b, *a: dpo_loss(*a, beta=b, loss_type="robust",
                                               label_smoothing=0.2))(0.3, *arrays)
    close(traced, eager)


def test_bfloat16_inputs_are_promoted_to_float32():
    arrays = [jnp.asarray(a, jnp.bfloat16) for a in _random_inputs(4)]
    loss, metrics = dpo_loss(*arrays)
    assert loss.dtype == jnp.float32 and metrics["margin"].dtype == jnp.float32
    assert sequence_logprobs(arrays[0][None], jnp.ones((1, 6))).dtype == jnp.float32
    assert simpo_loss(*arrays[:2])[0].dtype == jnp.float32
    assert orpo_loss(*arrays[:3])[0].dtype == jnp.float32
    assert reward_loss(*arrays[:2])[0].dtype == jnp.float32


@pytest.mark.parametrize("kw,match", [
    (dict(loss_type="kto"), "sigmoid, ipo, hinge, robust"),
    (dict(loss_type="robust", label_smoothing=0.5), r"\[0, 0.5\)"),
    (dict(loss_type="sigmoid", label_smoothing=0.6), r"\[0, 0.5\]"),
    (dict(loss_type="sigmoid", label_smoothing=-0.1), r"\[0, 0.5\]"),
    (dict(loss_type="ipo", label_smoothing=0.1), "sigmoid and robust only"),
    (dict(loss_type="hinge", label_smoothing=0.1), "sigmoid and robust only"),
    (dict(beta=0.0), "beta must be > 0"),
])
def test_dpo_rejects_bad_arguments(kw, match):
    with pytest.raises(ValueError, match=match):
        dpo_loss(*f32(*_random_inputs(4)), **kw)


def test_simpo_rejects_bad_beta():
    with pytest.raises(ValueError, match="beta must be > 0"):
        simpo_loss(*f32(*_random_inputs(2)), beta=-1.0)
