"""kto_loss and cispo_loss against float64 numpy transcriptions of their formulas, CISPO's
gradient on clipped tokens, and KTO's loss under any micro-batch split."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from hone.losses import cispo_loss, kto_loss, policy_loss, policy_loss_denominator
from hone.losses.kto import kto_reference_point, kto_terms



@pytest.fixture(autouse=True)
def x64():
    """float64 throughout this file, so the checks test the formulas, not float32 rounding."""
    with jax.enable_x64(True):
        yield


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def kto_numpy(p, r, good, kp, kr, beta, wd, wu):
    """The formula: z0 = max(0, mean(kp - kr)); λD·(1-σ(β(r-z0))) or λU·(1-σ(β(z0-r)))."""
    z0 = max(0.0, float(np.mean(kp - kr)))
    ratio = p - r
    per = np.where(good, wd * (1.0 - sigmoid(beta * (ratio - z0))),
                   wu * (1.0 - sigmoid(beta * (z0 - ratio))))
    return per.mean(), z0


def batch(seed=0, n=6, shift=0.0):
    rng = np.random.default_rng(seed)
    p, r = rng.normal(-20, 3, n), rng.normal(-20, 3, n)
    kp, kr = rng.normal(-30, 2, n) + shift, rng.normal(-30, 2, n)
    good = np.array([True, False, True, True, False, False])[:n]
    return p, r, good, kp, kr


@pytest.mark.parametrize("shift, beta, wd, wu", [
    (3.0, 0.1, 1.0, 1.0),    # policy above the reference on mismatched pairs: z0 > 0
    (-5.0, 0.1, 1.0, 1.0),   # below: the mean is negative and z0 is clamped at 0
    (3.0, 0.5, 1.33, 0.7),   # unequal class weights
])
def test_kto_loss_equals_the_formula(shift, beta, wd, wu):
    p, r, good, kp, kr = batch(shift=shift)
    want, z0 = kto_numpy(p, r, good, kp, kr, beta, wd, wu)
    assert (z0 == 0.0) == (shift < 0)
    loss, m = kto_loss(p, r, good, kp, kr, beta=beta, desirable_weight=wd, undesirable_weight=wu)
    assert loss.dtype == jnp.float64
    np.testing.assert_allclose(float(loss), want, rtol=0, atol=1e-6)
    np.testing.assert_allclose(float(m["z0"]), z0, atol=1e-12)
    np.testing.assert_allclose(float(m["kl"]), np.mean(kp - kr), atol=1e-12)
    rd, ru = beta * (p - r)[good].mean(), beta * (p - r)[~good].mean()
    np.testing.assert_allclose([float(m["rewards_desirable"]), float(m["rewards_undesirable"]),
                                float(m["margin"]), float(m["logps_desirable"])],
                               [rd, ru, rd - ru, p[good].mean()], atol=1e-12)


def test_kto_reference_point_is_detached_and_a_constant_of_the_gradient():
    p, r, good, kp, kr = batch(shift=3.0)
    g = jax.grad(lambda kp: kto_loss(p, r, good, kp, kr)[0])(jnp.asarray(kp))
    assert np.all(np.asarray(g) == 0.0)
    # d/dp of λD·σ(β(z0 - (p - r))) = -β·λD·σ(1-σ) at desirable examples, with z0 fixed.
    _, z0 = kto_numpy(p, r, good, kp, kr, 0.1, 1.0, 1.0)
    s = sigmoid(0.1 * (z0 - (p - r)))
    want = np.where(good, -0.1 * s * (1 - s), 0.1 * s * (1 - s)) / len(p)
    s_u = sigmoid(0.1 * ((p - r) - z0))
    want = np.where(good, want, 0.1 * s_u * (1 - s_u) / len(p))
    got = jax.grad(lambda p: kto_loss(p, r, good, kp, kr)[0])(jnp.asarray(p))
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-12)


@pytest.mark.parametrize("parts", [2, 3, 6])
def test_kto_loss_is_the_same_for_any_micro_batch_split(parts):
    """z0 from the whole batch, per-example terms summed per micro-batch over the batch's
    count: what the recipe's step does, equal to the whole batch's loss."""
    p, r, good, kp, kr = batch(shift=2.0)
    whole, _ = kto_loss(p, r, good, kp, kr, beta=0.3, desirable_weight=1.2)
    z0 = kto_reference_point(kp, kr)
    total = 0.0
    for idx in np.array_split(np.arange(len(p)), parts):
        losses, _ = kto_terms(p[idx], r[idx], good[idx], z0, beta=0.3, desirable_weight=1.2)
        total += float(jnp.sum(losses)) / len(p)
        # kto_loss on one micro-batch with the whole batch's mismatched pairs: its mean.
        part, _ = kto_loss(p[idx], r[idx], good[idx], kp, kr, beta=0.3, desirable_weight=1.2)
        np.testing.assert_allclose(float(part), float(jnp.mean(losses)), atol=1e-12)
    np.testing.assert_allclose(total, float(whole), atol=1e-6)
    # Padding pairs (valid 0) do not move the reference point.
    padded = kto_reference_point(np.r_[kp, 50.0], np.r_[kr, 0.0], np.r_[np.ones(6), 0.0])
    np.testing.assert_allclose(float(padded), float(z0), atol=1e-12)


def cispo_inputs(seed=1):
    rng = np.random.default_rng(seed)
    logp = rng.normal(-1.0, 0.5, (3, 5))
    old = logp - np.array([[0.0, 2.0, -0.1, 0.3, 1.5], [0.05, -2.0, 0.0, 1.9, 0.0],
                           [0.1, 0.2, 0.3, 0.4, 0.5]])  # ratios e^2 and e^1.9 exceed 1 + 4
    mask = np.array([[1, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 0]], np.float64)
    adv = np.array([0.7, -1.3, 2.0])
    return logp, old, adv, mask


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_cispo_loss_equals_the_formula(agg):
    logp, old, adv, mask = cispo_inputs()
    w = np.minimum(np.exp(logp - old), 1.0 + 4.0)
    per = -w * adv[:, None] * logp * mask
    if agg == "token-mean":
        want = per.sum() / mask.sum()
    else:  # mean over rows with a token, of each row's token mean
        rows = mask.sum(1) > 0
        want = (per.sum(1)[rows] / mask.sum(1)[rows]).mean()
    loss, m = cispo_loss(logp, old, adv, mask, clip_eps_high=4.0, agg=agg)
    np.testing.assert_allclose(float(loss), want, atol=1e-6)
    assert float(m["tokens"]) == mask.sum()
    assert float(m["clipped_sum"]) == 2  # the two ratios above 5 (A > 0 and A < 0 alike)
    # With the whole batch's denominator, micro-batches (rows) add up to the batch.
    den = policy_loss_denominator(mask, agg)
    parts = sum(float(cispo_loss(logp[i:i + 1], old[i:i + 1], adv[i:i + 1], mask[i:i + 1],
                                 clip_eps_high=4.0, agg=agg, denominator=den)[0])
                for i in range(3))
    np.testing.assert_allclose(parts, float(loss), atol=1e-12)


def test_cispo_gradient_reaches_every_token_where_policy_loss_drops_clipped_ones():
    logp, old, adv, mask = cispo_inputs()
    a = np.where(mask > 0, np.broadcast_to(adv[:, None], logp.shape), 0.0)
    w = np.minimum(np.exp(logp - old), 1.2)
    g = np.asarray(jax.grad(lambda lp: cispo_loss(lp, old, adv, mask, clip_eps_high=0.2)[0])(
        jnp.asarray(logp)))
    np.testing.assert_allclose(g, -w * a * mask / mask.sum(), atol=1e-12)
    assert np.all(g[mask > 0] != 0.0)
    # The clipped surrogate gives no gradient where ρ > 1.2 with A > 0 (row 0, tokens 1 and 4);
    # CISPO keeps them, weighted by the cap.
    gp = np.asarray(jax.grad(lambda lp: policy_loss(lp, old, adv, mask, clip_eps=0.2)[0])(
        jnp.asarray(logp)))
    assert gp[0, 1] == 0.0 and g[0, 1] == pytest.approx(-1.2 * 0.7 / mask.sum(), abs=1e-12)
    padded = np.where(mask > 0, logp, -np.inf)  # padding never reaches the loss
    assert np.isfinite(float(cispo_loss(padded, old, adv, mask)[0]))


def test_bad_options_are_rejected():
    logp, old, adv, mask = cispo_inputs()
    with pytest.raises(ValueError, match="agg"):
        cispo_loss(logp, old, adv, mask, agg="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="beta"):
        kto_loss(*batch(), beta=0.0)
    with pytest.raises(ValueError, match="undesirable_weight"):
        kto_loss(*batch(), undesirable_weight=-1.0)
