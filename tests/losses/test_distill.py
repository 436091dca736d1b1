"""hone.losses.distill: hand-computed values, parity with float64 transcriptions of the formulas
(TRL's generalized_jsd_loss in torch, numpy for the rest), the τ² factor, top-k renormalisation,
the alpha mix, the micro-batch contract, masking, extreme logits and argument checks.

The tolerance is 1e-6 (relative and absolute) everywhere and is never loosened. Parity checks run
jax with jax_enable_x64 so that they test the formulas, not float32 rounding; hand-computed values
and extreme inputs are checked in float32, the dtype training uses. Shapes are tiny, and the
numeric tests evaluate every divergence in one jitted call (`all_kinds`): compiling a handful of
graphs is what this file's runtime is made of.
"""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from hone.losses import attention_transfer_loss, distill_loss, feature_loss, topk_logits

TOL = 1e-6  # fixed; never loosened
# (kind, beta): jsd at β = ½ is symmetric in teacher and student, so 0.3 catches a role swap.
KINDS = (("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.0), ("jsd", 0.3), ("jsd", 0.5),
         ("jsd", 1.0))
DISTILL_METRICS = {"tokens", "distill_sum", "top1_agree_sum"}


def close(actual, expected, err_msg=""):
    np.testing.assert_allclose(np.asarray(actual, np.float64), np.asarray(expected, np.float64),
                               rtol=TOL, atol=TOL, err_msg=err_msg)


def f32(*xs):
    return [jnp.asarray(x, jnp.float32) for x in xs]


# Tiny graphs run in microseconds either way; skipping LLVM's optimisations cuts their compile
# time by about a third. A code-generation setting: the graph and its float semantics (no
# fast-math on XLA's CPU backend) are unchanged.
QUICK_COMPILE = {"xla_backend_optimization_level": 0}


@functools.partial(jax.jit, static_argnames=("kinds",), compiler_options=QUICK_COMPILE)
def all_kinds(s, teacher, mask, tau=2.0, alpha=None, targets=None, denominator=None,
              kinds=KINDS):
    """{(kind, beta): ((loss, metrics), d loss / d student logits)} for each of `kinds`.

    teacher: full logits [B, T, V] or a (values, indices) top-k pair. tau and alpha are traced
    (as a schedule would be), so changing them does not recompile.
    """
    full, top = (None, teacher) if isinstance(teacher, tuple) else (teacher, None)
    out = {}
    for kind, beta in kinds:
        def fn(x, kind=kind, beta=beta):
            return distill_loss(x, full, mask, temperature=tau, kind=kind, beta=beta, alpha=alpha,
                                targets=targets, teacher_topk=top, denominator=denominator)
        out[(kind, beta)] = jax.value_and_grad(fn, has_aux=True)(s)
    return out


# ---------------------------------------------------------------------------------------------
# References in float64.

def np_log_softmax(x):
    x = x - np.max(x, axis=-1, keepdims=True)
    return x - np.log(np.sum(np.exp(x), axis=-1, keepdims=True))


def np_kl(logp, logq):
    """Σ p·log(p/q) over the last axis, terms with p = 0 dropped."""
    p = np.exp(logp)
    return np.sum(p * np.where(p > 0, logp - logq, 0.0), axis=-1)


def trl_generalized_jsd(student_logits, teacher_logits, beta, temperature):
    """trl GKDTrainer.generalized_jsd_loss with reduction="none", summed over the vocabulary.

    F.kl_div(input, target, log_target=True) = exp(target)·(target - input) = KL(target ‖ input).
    """
    student_log_probs = F.log_softmax(student_logits / temperature, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits / temperature, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        beta = torch.tensor(beta, dtype=student_log_probs.dtype)
        mixture_log_probs = torch.logsumexp(
            torch.stack([student_log_probs + torch.log(1 - beta),
                         teacher_log_probs + torch.log(beta)]), dim=0)
        kl_teacher = F.kl_div(mixture_log_probs, teacher_log_probs, reduction="none",
                              log_target=True)
        kl_student = F.kl_div(mixture_log_probs, student_log_probs, reduction="none",
                              log_target=True)
        jsd = beta * kl_teacher + (1 - beta) * kl_student
    return jsd.sum(-1)  # [B, T]


def ref_per_token(s, t, kind, beta, tau):
    """τ²·divergence per token [B, T] from float64 torch tensors (autograd gives gradients)."""
    if kind == "jsd":
        return tau ** 2 * trl_generalized_jsd(s, t, beta, tau)
    ls, lt = F.log_softmax(s / tau, -1), F.log_softmax(t / tau, -1)
    if kind == "forward_kl":  # KL(t ‖ s)
        return tau ** 2 * F.kl_div(ls, lt, reduction="none", log_target=True).sum(-1)
    return tau ** 2 * F.kl_div(lt, ls, reduction="none", log_target=True).sum(-1)


def ref_np(s, t, kind, beta, tau):
    return ref_per_token(torch.tensor(s), torch.tensor(t), kind, beta, tau).numpy()


def ref_ce(s, targets):
    return -np.take_along_axis(np_log_softmax(s), targets[..., None], -1)[..., 0]


def masked_mean(x, mask):
    return np.sum(x * mask) / max(np.sum(mask), 1.0)


def random_batch(seed, b=2, t=3, v=5, scale=3.0):
    rng = np.random.default_rng(seed)
    s = scale * rng.normal(size=(b, t, v))
    tch = scale * rng.normal(size=(b, t, v))
    mask = (rng.random((b, t)) < 0.7).astype(np.float64)
    mask[0, 0] = 1.0
    targets = rng.integers(0, v, size=(b, t))
    return s, tch, mask, targets


# ---------------------------------------------------------------------------------------------
# distill_loss by hand (float32).

# One token, V = 2, τ = 1: teacher logits [0, 0] -> p_t = [1/2, 1/2]; student [0, ln 3] ->
# p_s = [1/4, 3/4].
#   forward  KL(t‖s) = ½ln(½/¼) + ½ln(½/¾) = ½ln2 + ½ln(2/3) = ½ln(4/3)          ≈ 0.1438410
#   reverse  KL(s‖t) = ¼ln(¼/½) + ¾ln(¾/½) = -¼ln2 + ¾ln(3/2)                     ≈ 0.1308120
#   jsd β=½: m = [3/8, 5/8]; KL(t‖m) = ½ln(4/3) + ½ln(4/5) = ½ln(16/15)
#            KL(s‖m) = ¼ln(2/3) + ¾ln(6/5); jsd = ½(KL(t‖m) + KL(s‖m))           ≈ 0.0338213
#   jsd β=0 is the forward KL, β=1 the reverse KL (TRL's special cases).
FORWARD = 0.5 * math.log(4 / 3)
REVERSE = -0.25 * math.log(2) + 0.75 * math.log(1.5)
HAND = {("forward_kl", 0.5): FORWARD, ("reverse_kl", 0.5): REVERSE, ("jsd", 0.0): FORWARD,
        ("jsd", 0.5): 0.5 * (0.5 * math.log(16 / 15) + 0.25 * math.log(2 / 3)
                             + 0.75 * math.log(1.2)),
        ("jsd", 1.0): REVERSE}


def test_distill_by_hand():
    s, t = f32([[[0.0, math.log(3)]]], [[[0.0, 0.0]]])
    out = all_kinds(s, t, jnp.ones((1, 1)), 1.0)
    for key, want in HAND.items():
        (loss, metrics), _ = out[key]
        close(loss, want, err_msg=str(key))
        assert set(metrics) == DISTILL_METRICS
        close(metrics["tokens"], 1.0)
        close(metrics["distill_sum"], want)
        close(metrics["top1_agree_sum"], 0.0)  # the teacher's tie goes to id 0, the student's: 1


def test_temperature_squared_factor_by_hand():
    # τ = 2 with student logits [0, 2 ln 3]: s/τ = [0, ln 3], the same p_s as above, so each loss
    # is τ² = 4 times the hand value at τ = 1 (forward: 4·0.1438410 = 0.5753641).
    s, t = f32([[[0.0, 2 * math.log(3)]]], [[[0.0, 0.0]]])
    out = all_kinds(s, t, jnp.ones((1, 1)), 2.0)
    for key, want in HAND.items():
        close(out[key][0][0], 4.0 * want, err_msg=str(key))


def test_loss_at_tau_is_tau_squared_times_plain_divergence():
    s, t, mask, _ = random_batch(0)
    with jax.enable_x64(True):
        at_tau = jax.device_get(all_kinds(s, t, mask, 3.0))
        plain = jax.device_get(all_kinds(s / 3.0, t / 3.0, mask, 1.0))
    for key in KINDS:
        close(at_tau[key][0][0], 9.0 * plain[key][0][0], err_msg=str(key))


def test_masked_tokens_do_not_count_or_leak():
    # Token 2 is padding holding NaN and inf logits: the loss is token 1's alone. alpha = ½ gives
    # ½·HAND + ½·CE with CE = -ln ¾ (target 1 has p_s = ¾); the masked target -100 is ignored.
    s = jnp.asarray([[[0.0, math.log(3)], [np.nan, np.inf]]], jnp.float32)
    t = jnp.asarray([[[0.0, 0.0], [np.inf, -np.inf]]], jnp.float32)
    out = all_kinds(s, t, jnp.asarray([[1.0, 0.0]]), 1.0, alpha=0.5,
                    targets=jnp.asarray([[1, -100]]))
    for key, want in HAND.items():
        (loss, metrics), grad = out[key]
        close(loss, 0.5 * want - 0.5 * math.log(0.75), err_msg=str(key))
        close(metrics["tokens"], 1.0)
        close(metrics["ce_sum"], -math.log(0.75))
        assert np.all(np.isfinite(grad)) and np.all(np.asarray(grad)[0, 1] == 0), key


def test_banned_teacher_tokens_give_zero_terms():
    # A -inf teacher logit has p_t = 0, and 0·log 0 = 0: teacher [0, 0, -inf] is [½, ½, 0].
    s, t = f32([[[0.0, math.log(3), 1.0]]], [[[0.0, 0.0, -np.inf]]])
    out = all_kinds(s, t, jnp.ones((1, 1)), 1.0)
    ls = np_log_softmax(np.array([0.0, math.log(3), 1.0]))
    (loss, _), grad = out[("forward_kl", 0.5)]
    close(loss, 0.5 * (math.log(0.5) - ls[0]) + 0.5 * (math.log(0.5) - ls[1]))
    assert np.all(np.isfinite(grad))
    # p_t = 0 where p_s > 0: reverse KL is +inf; JSD's mixture keeps it finite.
    assert out[("reverse_kl", 0.5)][0][0] == np.inf
    (loss, _), grad = out[("jsd", 0.3)]
    assert np.isfinite(loss) and np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------------------------
# distill_loss against the references.

@pytest.mark.parametrize("scale", [3.0, 1e3])
def test_distill_matches_reference(scale):
    s, t, mask, _ = random_batch(1, scale=scale)
    tau = 2.0
    with jax.enable_x64(True):
        out = jax.device_get(all_kinds(s, t, mask, tau))
    out32 = all_kinds(*f32(s, t, mask), tau)
    agree = np.sum((np.argmax(s, -1) == np.argmax(t, -1)) * mask)
    for key in KINDS:
        (loss, metrics), grad = out[key]
        st = torch.tensor(s, requires_grad=True)
        per_token = ref_per_token(st, torch.tensor(t), *key, tau)
        want = (per_token * torch.tensor(mask)).sum() / mask.sum()
        want.backward()
        close(loss, want.item(), err_msg=str(key))
        close(grad, st.grad.numpy(), err_msg=str(key))
        close(metrics["distill_sum"], want.item() * mask.sum())
        close(metrics["tokens"], mask.sum())
        close(metrics["top1_agree_sum"], agree)
        # float32 (at the 1e3 scale too): a finite loss and gradient
        (loss32, _), grad32 = out32[key]
        assert np.isfinite(loss32) and np.all(np.isfinite(grad32)), key


def test_jsd_tends_to_forward_kl_over_beta():
    # GKD: JSD_β/β -> KL(t‖s) as β -> 0, the limit TRL's β = 0 special case stands for.
    s, t, mask, _ = random_batch(2)
    with jax.enable_x64(True):
        fwd = all_kinds(s, t, mask)[("forward_kl", 0.5)][0][0]
        small = all_kinds(s, t, mask, kinds=(("jsd", 1e-7),))[("jsd", 1e-7)][0][0]
        fwd, small = jax.device_get((fwd, small))
    np.testing.assert_allclose(small / 1e-7, fwd, rtol=1e-5)  # an O(β) remainder


# ---------------------------------------------------------------------------------------------
# Top-k teacher.

def test_topk_logits():
    values, indices = topk_logits(jnp.asarray([[3.0, -1.0, 7.0, 0.5]]), 2)
    close(values, [[7.0, 3.0]])
    assert indices.dtype == jnp.int32 and indices.tolist() == [[2, 0]]


def test_topk_with_k_equal_v_is_the_full_loss():
    s, t, mask, _ = random_batch(3)
    with jax.enable_x64(True):
        full = jax.device_get(all_kinds(s, t, mask))
        topk = topk_logits(jnp.asarray(t), t.shape[-1])  # a permutation of the vocabulary
        out = jax.device_get(all_kinds(s, topk, mask))
    for key in KINDS:
        close(out[key][0][0], full[key][0][0], err_msg=str(key))
        close(out[key][1], full[key][1], err_msg=str(key))
        for name, value in full[key][0][1].items():
            close(out[key][0][1][name], value, err_msg=f"{key} {name}")


def test_topk_renormalises_the_teacher():
    s, t, mask, _ = random_batch(4)
    k, tau = 3, 2.0
    idx = np.argsort(-t, axis=-1)[..., :k]  # [B, T, K]
    vals = np.take_along_axis(t, idx, -1)
    with jax.enable_x64(True):
        out = jax.device_get(all_kinds(s, (vals, idx), mask, tau))
    for kind, beta in KINDS:
        if kind == "forward_kl":
            # the kept teacher logits renormalised; the student's full log-softmax at their ids
            lt = np_log_softmax(vals / tau)
            ls = np.take_along_axis(np_log_softmax(s / tau), idx, -1)
            want = tau ** 2 * np_kl(lt, ls)
        else:  # the student renormalised over the kept ids too: the full formula on K logits
            want = ref_np(np.take_along_axis(s, idx, -1), vals, kind, beta, tau)
        close(out[(kind, beta)][0][0], masked_mean(want, mask), err_msg=kind)


def test_topk_by_hand():
    # V = 3, K = 2, τ = 1. Kept teacher logits [0, 0] at ids [2, 0] -> p_t = ½ on each.
    # Student logits [0, 0, ln 2] -> p_s = [¼, ¼, ½].
    # forward: read at ids [2, 0]: [½, ¼] (not renormalised); KL = ½ln(½/½) + ½ln(½/¼) = ½ln2.
    # reverse: renormalised over ids [2, 0]: [⅔, ⅓]; KL(s‖t) = ⅔ln(4/3) + ⅓ln(2/3).
    s = f32([[[0.0, 0.0, math.log(2)]]])[0]
    topk = (jnp.zeros((1, 1, 2)), jnp.asarray([[[2, 0]]]))
    out = all_kinds(s, topk, jnp.ones((1, 1)), 1.0)
    close(out[("forward_kl", 0.5)][0][0], 0.5 * math.log(2))
    close(out[("reverse_kl", 0.5)][0][0], 2 / 3 * math.log(4 / 3) + 1 / 3 * math.log(2 / 3))
    close(out[("forward_kl", 0.5)][0][1]["top1_agree_sum"], 1.0)  # both pick id 2


# ---------------------------------------------------------------------------------------------
# Alpha, the micro-batch contract, traced hyper-parameters, bfloat16.

def test_alpha_mixes_cross_entropy():
    s, t, mask, targets = random_batch(5)
    ce = ref_ce(s, targets)  # at τ = 1
    for alpha in (0.0, 0.3, 1.0):
        with jax.enable_x64(True):
            out = jax.device_get(all_kinds(s, t, mask, alpha=alpha, targets=targets))
        for key in KINDS:
            (loss, metrics), _ = out[key]
            div = ref_np(s, t, *key, 2.0)
            close(loss, masked_mean(alpha * div + (1 - alpha) * ce, mask), err_msg=str(key))
            close(metrics["ce_sum"], np.sum(ce * mask))
            close(metrics["distill_sum"], np.sum(div * mask))


@pytest.mark.parametrize("topk", [False, True])
def test_micro_batches_sum_to_the_full_batch(topk):
    # 4 micro-batches of 2 rows, each over the full batch's token count, sum to the 1 x 8 loss.
    # One kind per code path (top-k renormalises the student for reverse_kl and jsd).
    kinds = (("forward_kl", 0.5), ("reverse_kl", 0.5), ("jsd", 0.3))
    s, t, mask, targets = random_batch(6, b=8)
    mask[3] = 0.0  # an empty row
    with jax.enable_x64(True):
        teacher = jax.device_get(topk_logits(t, 3)) if topk else t  # numpy: cheap to slice
        full = all_kinds(s, teacher, mask, alpha=0.7, targets=targets, kinds=kinds)
        parts = [all_kinds(s[r], jax.tree.map(lambda x: x[r], teacher), mask[r],  # noqa: B023
                           alpha=0.7, targets=targets[r], denominator=mask.sum(), kinds=kinds)
                 for r in (slice(i, i + 2) for i in range(0, 8, 2))]
        full, parts = jax.device_get((full, parts))
    for key in kinds:
        (loss, metrics), grad = full[key]
        close(sum(p[key][0][0] for p in parts), loss, err_msg=str(key))
        close(np.concatenate([p[key][1] for p in parts]), grad, err_msg=str(key))
        for name, value in metrics.items():
            close(sum(p[key][0][1][name] for p in parts), value, err_msg=f"{key} {name}")


def test_traced_beta():
    # temperature, beta and alpha all tracers (a schedule inside jit): the same formula.
    s, t, mask, targets = random_batch(7)
    jitted = jax.jit(lambda tau, beta, alpha: distill_loss(
        s, t, mask, temperature=tau, kind="jsd", beta=beta, alpha=alpha, targets=targets)[0])
    with jax.enable_x64(True):
        loss = jitted(1.5, 0.25, 0.6)
    want = 0.6 * ref_np(s, t, "jsd", 0.25, 1.5) + 0.4 * ref_ce(s, targets)
    close(loss, masked_mean(want, mask))


def test_eager_bfloat16_is_promoted():
    s, t, mask, _ = random_batch(8)
    s16, t16 = jnp.asarray(s, jnp.bfloat16), jnp.asarray(t, jnp.bfloat16)
    loss, metrics = distill_loss(s16, t16, mask)
    assert loss.dtype == jnp.float32 and metrics["distill_sum"].dtype == jnp.float32
    want = ref_np(np.asarray(s16, np.float64), np.asarray(t16, np.float64), "forward_kl", 0.5, 2.0)
    np.testing.assert_allclose(loss, masked_mean(want, mask), rtol=1e-5)  # float32 arithmetic


# ---------------------------------------------------------------------------------------------
# Attention transfer.

attention = jax.jit(attention_transfer_loss, compiler_options=QUICK_COMPILE)


def test_attention_by_hand():
    # One query, two keys. Student [½, ½], teacher [1, 0]: (½-1)² + (½-0)² = ½.
    # A second, masked query holds junk and does not count.
    a_s = jnp.asarray([[[[0.5, 0.5], [np.nan, 0.1]]]])  # [1, 1, 2, 2]
    a_t = jnp.asarray([[[[1.0, 0.0], [0.0, 1.0]]]])
    loss, metrics = attention(a_s, a_t, jnp.asarray([[1, 0]]))
    close(loss, 0.5)
    close(metrics["tokens"], 1.0)
    # Two student heads [1, 0] and [0, 1] average to [½, ½]; one teacher head [1, 0]: ½ again.
    two = jnp.asarray([[[[1.0, 0.0]], [[0.0, 1.0]]]])  # [1, 2, 1, 2]
    close(attention(two, a_t[:, :, :1])[0], 0.5)


@pytest.mark.parametrize("heads", [(2, 2), (2, 4)])
def test_attention_matches_reference(heads):
    rng = np.random.default_rng(9)
    a_s = np.exp(np_log_softmax(rng.normal(size=(2, heads[0], 3, 4))))
    a_t = np.exp(np_log_softmax(rng.normal(size=(2, heads[1], 3, 4))))
    mask = np.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    if heads[0] != heads[1]:
        ref_s, ref_t = a_s.mean(1, keepdims=True), a_t.mean(1, keepdims=True)
    else:
        ref_s, ref_t = a_s, a_t
    per_query = ((ref_s - ref_t) ** 2).sum(-1).mean(1)  # [B, T]
    with jax.enable_x64(True):
        loss, _ = attention(a_s, a_t, mask)
        parts = [attention(a_s[i:i + 1], a_t[i:i + 1], mask[i:i + 1], denominator=mask.sum())[0]
                 for i in range(2)]
        loss, parts = jax.device_get((loss, parts))
    close(loss, masked_mean(per_query, mask))
    close(sum(parts), loss)


# ---------------------------------------------------------------------------------------------
# Feature matching.

FEATURE_CASES = tuple((pool, kind) for pool in ("mean", "last", "none")
                      for kind in ("l2", "cosine"))


@functools.partial(jax.jit, compiler_options=QUICK_COMPILE)
def all_features(h_s, h_t, mask, projection=None, denominator=None):
    """{(pool, kind): (loss, metrics)} for every pooling and distance, in one compile."""
    return {(pool, kind): feature_loss(h_s, h_t, mask, pool=pool, kind=kind,
                                       projection=projection, denominator=denominator)
            for pool, kind in FEATURE_CASES}


def test_feature_by_hand():
    # Two tokens, D = 2; token 2 is padding (junk), so every pooling sees token 1 alone.
    # student [1, 0], teacher [0, 2]: l2 = ((1-0)² + (0-2)²)/2 = 2.5; cosine: 1 - 0/(1·2) = 1.
    h_s = jnp.asarray([[[1.0, 0.0], [np.nan, 5.0]]])
    h_t = jnp.asarray([[[0.0, 2.0], [3.0, np.inf]]])
    mask = jnp.asarray([[1, 0]])
    out = all_features(h_s, h_t, mask)
    for (pool, kind), (loss, _) in out.items():
        close(loss, 2.5 if kind == "l2" else 1.0, err_msg=f"{pool} {kind}")
    # A projection [3, 2] whose first two rows swap the axes maps student [1, 0, 0] to [0, 1]:
    # cosine with [0, 2] is 1, loss 0; l2 = (0² + (1-2)²)/2 = ½.
    w = jnp.asarray([[0.0, 1.0], [1.0, 0.0], [7.0, 7.0]])
    h3 = jnp.asarray([[[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]]])
    out = all_features(h3, h_t, mask, w)
    close(out[("mean", "cosine")][0], 0.0)
    loss, metrics = out[("mean", "l2")]
    close(loss, 0.5)
    close(metrics["sequences"], 1.0)
    close(metrics["cos_sum"], 1.0)
    close(out[("none", "l2")][1]["tokens"], 1.0)


def test_feature_matches_reference():
    rng = np.random.default_rng(10)
    h_s, h_t, w = rng.normal(size=(3, 4, 3)), rng.normal(size=(3, 4, 2)), rng.normal(size=(3, 2))
    mask = np.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], np.float64)  # row 3 empty
    p = h_s @ w  # [B, T, Dt]: the projection applied to every token
    cnt = np.maximum(mask.sum(1, keepdims=True), 1)
    last = np.array([2, 0, 0])
    pooled = {"mean": ((p * mask[..., None]).sum(1) / cnt, (h_t * mask[..., None]).sum(1) / cnt,
                       mask.any(1)),
              "last": (p[np.arange(3), last], h_t[np.arange(3), last], mask.any(1)),
              "none": (p, h_t, mask.astype(bool))}
    with jax.enable_x64(True):
        out = jax.device_get(all_features(h_s, h_t, mask, w))
        parts = jax.device_get([all_features(h_s[i:i + 1], h_t[i:i + 1], mask[i:i + 1], w,
                                             denominator=n)
                                for i, n in ((0, 2.0), (1, 2.0), (2, 2.0))])  # 2 pooled rows
    for (pool, kind), (loss, metrics) in out.items():
        a, b, items = pooled[pool]
        with np.errstate(invalid="ignore"):  # the empty row pools to 0/0; it is not an item
            cos = (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1))
        per = ((a - b) ** 2).mean(-1) if kind == "l2" else 1 - cos
        close(loss, per[items].mean(), err_msg=f"{pool} {kind}")
        close(metrics["cos_sum"], cos[items].sum())
        if pool != "none":
            close(sum(part[(pool, kind)][0] for part in parts), loss, err_msg=f"{pool} {kind}")


def test_feature_zero_vector_cosine_is_finite():
    h = jnp.zeros((1, 1, 2))
    (loss, _), grad = jax.jit(jax.value_and_grad(
        lambda x: feature_loss(x, h, jnp.ones((1, 1)), kind="cosine"), has_aux=True))(h)
    close(loss, 1.0)
    assert np.all(np.isfinite(grad))


# ---------------------------------------------------------------------------------------------
# Argument checks.

S, T, M = jnp.zeros((1, 2, 4)), jnp.zeros((1, 2, 4)), jnp.ones((1, 2))


@pytest.mark.parametrize("call,match", [
    (lambda: distill_loss(S, T, M, kind="kl"), "forward_kl, reverse_kl, jsd"),
    (lambda: distill_loss(S, T, M, temperature=0.0), "temperature must be > 0"),
    (lambda: distill_loss(S, T, M, kind="jsd", beta=1.5), r"beta must be in \[0, 1\]"),
    (lambda: distill_loss(S, T, M, alpha=0.5), "alpha and targets go together"),
    (lambda: distill_loss(S, T, M, targets=jnp.zeros((1, 2), int)), "alpha and targets"),
    (lambda: distill_loss(S, T, M, alpha=2.0, targets=jnp.zeros((1, 2), int)),
     r"alpha must be in \[0, 1\]"),
    (lambda: distill_loss(S, None, M), "exactly one of"),
    (lambda: distill_loss(S, T, M, teacher_topk=topk_logits(T, 2)), "exactly one of"),
    (lambda: distill_loss(S, T[..., :3], M), "differ"),
    (lambda: distill_loss(S, T, jnp.ones((2, 2))), "mask"),
    (lambda: distill_loss(S, None, M, teacher_topk=(jnp.zeros((1, 2, 2)),
                                                    jnp.zeros((1, 2, 3), int))), "K <= V"),
    (lambda: topk_logits(S, 5), r"k must be an int in \[1, 4\]"),
    (lambda: topk_logits(S, 0), "k must be"),
    (lambda: attention_transfer_loss(jnp.zeros((1, 2, 3, 3)), jnp.zeros((1, 2, 3, 4))),
     r"\[B, H, T, S\]"),
    (lambda: attention_transfer_loss(jnp.zeros((1, 2, 3, 3)), jnp.zeros((1, 2, 3, 3)),
                                     jnp.ones((1, 2))), "mask"),
    (lambda: feature_loss(S, T, M, pool="max"), "mean, last, none"),
    (lambda: feature_loss(S, T, M, kind="l1"), "l2, cosine"),
    (lambda: feature_loss(S, T[..., :3], M), "pass a projection"),
    (lambda: feature_loss(S, T[..., :3], M, projection=jnp.zeros((3, 4))), "projection must be"),
    (lambda: feature_loss(S, T, jnp.ones((1, 3))), "share"),
])
def test_bad_arguments_raise(call, match):
    with pytest.raises(ValueError, match=match):
        call()
