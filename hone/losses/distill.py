"""Distillation losses: token-level KL/JSD against a teacher's logits (full or top-k), attention
transfer and hidden-feature matching.

Letters: B sequences, T positions, V vocabulary, K kept teacher logits, H heads, S key positions,
D hidden width. A mask is 1 on the tokens that are trained. Design choices:

- Every log-probability is a log-softmax (never the log of a softmax), so logits of 1e3 give
  exact, finite losses; a term p·log(p/q) with p = 0 is 0, selected away with jnp.where before
  the product, so a -inf logit (a banned token) gives no NaN in the value or the gradient.
- The teacher is a target: its logits, maps and features pass through stop_gradient.
- Inputs narrower than float32 are promoted to float32; float64 stays float64 (the tests).
- Every loss is a masked sum over its denominator: by default the number of real tokens (or of
  non-empty rows, for pooled features), at least 1. A train step that splits a batch into
  micro-batches passes the full batch's count and sums the results, as with policy_loss; the
  metrics are sums and counts under stop_gradient, which add across micro-batches too.
- Options that choose a formula (kind, pool, k, alpha with targets) are checked eagerly with
  ValueError; numeric ones (temperature, beta, alpha) only when plain Python numbers.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.losses.common import check_choice, is_number, promote, stopped_sums
from hone.losses.rl import policy_loss_denominator

DISTILL_KINDS = ("forward_kl", "reverse_kl", "jsd")
POOLS = ("mean", "last", "none")
FEATURE_KINDS = ("l2", "cosine")

_COS_EPS = 1e-8  # torch's cosine_similarity eps: each norm is at least this


def _kl(logp: jax.Array, logq: jax.Array) -> jax.Array:
    """Σ_v p·(log p - log q) over the last axis, with 0·log 0 = 0: [..., V] -> [...]."""
    p = jnp.exp(logp)
    # The inner where keeps -inf - -inf = NaN out of the unselected branch's gradient too.
    return jnp.sum(p * jnp.where(p > 0, logp - logq, 0.0), axis=-1)


def _jsd(log_t: jax.Array, log_s: jax.Array, beta) -> jax.Array:
    """TRL's generalized_jsd_loss per token: β·KL(t‖m) + (1-β)·KL(s‖m), m = β·t + (1-β)·s.

    At β = 0 and 1 the mixture collapses and TRL switches to KL(t‖s) and KL(s‖t) (forward and
    reverse KL); so does this, when β is a Python number. A traced β must lie in (0, 1).
    """
    if is_number(beta) and beta == 0:
        return _kl(log_t, log_s)
    if is_number(beta) and beta == 1:
        return _kl(log_s, log_t)
    beta = jnp.asarray(beta, log_t.dtype)
    log_m = jnp.logaddexp(log_s + jnp.log1p(-beta), log_t + jnp.log(beta))  # [..., V]
    return beta * _kl(log_t, log_m) + (1.0 - beta) * _kl(log_s, log_m)


def topk_logits(logits: jax.Array, k: int) -> tuple[jax.Array, jax.Array]:
    """The k largest logits and their vocabulary ids, largest first: [..., V] -> [..., k] twice.

    Values keep the logits' dtype, ids are int32: what a teacher pass stores to disk (K/V of the
    full logits) for `distill_loss(..., teacher_topk=(values, indices))`.
    """
    logits = jnp.asarray(logits)
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= logits.shape[-1]:
        raise ValueError(f"topk_logits: k must be an int in [1, {logits.shape[-1]}], got {k!r}")
    values, indices = jax.lax.top_k(logits, k)
    return values, indices.astype(jnp.int32)


def distill_loss(student_logits: jax.Array, teacher_logits: jax.Array | None, mask: jax.Array, *,
                 temperature: float = 2.0, kind: str = "forward_kl", beta: float = 0.5,
                 alpha: float | None = None, targets: jax.Array | None = None,
                 teacher_topk: tuple[jax.Array, jax.Array] | None = None,
                 denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """Token-level distillation: τ²·D(teacher, student) per token, masked mean.

    student_logits [B, T, V]; teacher_logits [B, T, V], or None with teacher_topk = (values
    [B, T, K], indices [B, T, K]) from topk_logits; mask [B, T]. With p = softmax(logits/τ):
      forward_kl  τ²·KL(p_t ‖ p_s) = τ²·Σ_v p_t·(log p_t - log p_s)   (Hinton et al. 2015)
      reverse_kl  τ²·KL(p_s ‖ p_t)
      jsd         τ²·[β·KL(p_t ‖ m) + (1-β)·KL(p_s ‖ m)], m = β·p_t + (1-β)·p_s: TRL's
                  generalized_jsd_loss (GKD, Agarwal et al. 2024, eq. 1) with P = teacher, times
                  τ² (TRL has no τ² factor). β = 0 is forward KL, β = 1 reverse KL (TRL's special
                  cases); between, JSD_β/β tends to forward KL as β -> 0. β ∈ [0, 1]; a
                  traced β (a schedule) always takes the mixture form, so must lie in (0, 1).
    The τ² keeps the gradient's scale independent of τ (Hinton et al.).

    Top-k teacher: p_t = softmax(values/τ) over its K kept logits (renormalised); the KL runs over
    the teacher's support. forward_kl uses the student's full log-softmax gathered at the K ids
    (not renormalised: the student is pulled to put its mass there; with K = V it is exactly the
    full loss). reverse_kl and jsd need p_t wherever p_s > 0, which the top-k teacher does not
    have (it would be +inf), so there the student too is renormalised over the K ids: the
    divergence between the two distributions conditioned on the teacher's top-k set. That term
    does not constrain the student's mass outside the set; alpha's cross-entropy can.

    alpha (None: pure distillation): per token alpha·distill + (1-alpha)·CE(student_logits at
    τ = 1, targets [B, T]). With `denominator`: the masked sum over it.
    Metrics (sums over real tokens): tokens; distill_sum (the τ²-scaled divergence); ce_sum
    (with alpha); top1_agree_sum (student argmax = teacher argmax).
    """
    terms = distill_token_terms(student_logits, teacher_logits, mask, temperature=temperature,
                                kind=kind, beta=beta, alpha=alpha, targets=targets,
                                teacher_topk=teacher_topk)
    return distill_from_terms(terms, denominator)


def distill_token_terms(student_logits: jax.Array, teacher_logits: jax.Array | None,
                        mask: jax.Array, *, temperature: float = 2.0, kind: str = "forward_kl",
                        beta: float = 0.5, alpha: float | None = None,
                        targets: jax.Array | None = None,
                        teacher_topk: tuple[jax.Array, jax.Array] | None = None) -> dict:
    """distill_loss's per-token terms, each [B, T] and 0 on masked tokens: "loss" (what the
    loss sums), "distill" (τ²·divergence), "ce" (with alpha), "top1_agree" and "tokens" (bool).

    Every position is computed on its own, so a chunked LM head (`hone.models.head`) can call
    this on chunks of positions and concatenate; `distill_from_terms` then reduces the terms
    exactly as distill_loss does. Arguments as distill_loss's.
    """
    fn = "distill_loss"
    check_choice(fn, "kind", kind, DISTILL_KINDS)
    if (teacher_logits is None) == (teacher_topk is None):
        raise ValueError(f"{fn}: give exactly one of teacher_logits and teacher_topk")
    if is_number(temperature) and not temperature > 0:
        raise ValueError(f"{fn}: temperature must be > 0, got {temperature!r}")
    if kind == "jsd" and is_number(beta) and not 0 <= beta <= 1:
        raise ValueError(f"{fn}: beta must be in [0, 1], got {beta!r}")
    if (alpha is None) != (targets is None):
        raise ValueError(f"{fn}: alpha and targets go together (alpha mixes in the cross-entropy "
                         f"on targets); got alpha={alpha!r} and targets "
                         f"{'None' if targets is None else 'given'}")
    if is_number(alpha) and not 0 <= alpha <= 1:
        raise ValueError(f"{fn}: alpha must be in [0, 1], got {alpha!r}")

    if teacher_topk is not None:
        values, idx = teacher_topk
        s, t = promote(student_logits, values)
        idx = jnp.asarray(idx).astype(jnp.int32)
        if t.shape != idx.shape or t.shape[:-1] != s.shape[:-1] or t.shape[-1] > s.shape[-1]:
            raise ValueError(f"{fn}: teacher_topk values {t.shape} and indices {idx.shape} must "
                             f"be [B, T, K] with K <= V for student logits {s.shape}")
    else:
        s, t = promote(student_logits, teacher_logits)
        if s.shape != t.shape:
            raise ValueError(f"{fn}: student {s.shape} and teacher {t.shape} logits differ")
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    if keep.shape != s.shape[:-1]:
        raise ValueError(f"{fn}: mask {keep.shape} must be logits' [B, T] {s.shape[:-1]}")
    # Padding may hold junk (NaN, inf): select it away first, so no gradient can see it.
    s = jnp.where(keep[..., None], s, 0.0)
    t = jnp.where(keep[..., None], jax.lax.stop_gradient(t), 0.0)

    log_t = jax.nn.log_softmax(t / temperature, axis=-1)  # [B, T, V] or [B, T, K]
    if teacher_topk is None:
        log_s = jax.nn.log_softmax(s / temperature, axis=-1)  # [B, T, V]
        teacher_top1 = jnp.argmax(t, axis=-1)  # [B, T]
    else:
        if kind == "forward_kl":  # the full distribution, read at the teacher's ids
            log_s = jnp.take_along_axis(jax.nn.log_softmax(s / temperature, axis=-1), idx, -1)
        else:  # renormalised over them
            log_s = jax.nn.log_softmax(jnp.take_along_axis(s, idx, -1) / temperature, axis=-1)
        teacher_top1 = jnp.take_along_axis(idx, jnp.argmax(t, axis=-1)[..., None], -1)[..., 0]
    if kind == "forward_kl":
        div = _kl(log_t, log_s)  # [B, T]
    elif kind == "reverse_kl":
        div = _kl(log_s, log_t)
    else:
        div = _jsd(log_t, log_s, beta)
    div = jnp.where(keep, temperature ** 2 * div, 0.0)  # [B, T]

    agree = keep & (jnp.argmax(s, axis=-1) == teacher_top1)  # [B, T]
    terms = {"loss": div, "distill": div, "top1_agree": agree, "tokens": keep}
    if alpha is not None:
        tgt = jnp.where(keep, jnp.asarray(targets).astype(jnp.int32), 0)[..., None]  # [B, T, 1]
        ce = jax.nn.logsumexp(s, axis=-1) - jnp.take_along_axis(s, tgt, -1)[..., 0]  # [B, T]
        ce = jnp.where(keep, ce, 0.0)
        terms["loss"], terms["ce"] = alpha * div + (1.0 - alpha) * ce, ce
    return terms


def distill_from_terms(terms: dict, denominator: jax.Array | float | None = None
                       ) -> tuple[jax.Array, dict]:
    """(loss, metrics) of distill_loss from its per-token terms (`distill_token_terms`, whole
    rows or chunks of positions concatenated): the masked sum over `denominator` (default: the
    number of real tokens) and the metrics' sums."""
    keep = terms["tokens"]  # [B, T]
    if denominator is None:
        denominator = policy_loss_denominator(keep, "token-mean")
    loss = jnp.sum(terms["loss"]) / denominator
    sums = {("tokens" if k == "tokens" else f"{k}_sum"): v for k, v in terms.items()
            if k != "loss"}
    return loss, stopped_sums(terms["distill"].dtype, **sums)


def attention_transfer_loss(student_attn: jax.Array, teacher_attn: jax.Array,
                            mask: jax.Array | None = None, *,
                            denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """Squared distance between attention maps [B, H, T, S] (probabilities over keys S).

    Per query position: Σ_s (a_student - a_teacher)², averaged over heads; then the masked mean
    over queries (mask [B, T], default all). This is TinyBERT's attention loss (Jiao et al. 2020,
    eq. 7: MSE of the per-head attention matrices) applied to the softmax probabilities, with the
    keys summed rather than averaged, so the scale does not depend on how far S is padded.
    When the head counts differ, each side is first averaged over its heads (one map per layer);
    equal counts compare head by head. The recipe picks the layer pairs and weights the sum.
    Metrics (sums): tokens (the real query positions).
    """
    fn = "attention_transfer_loss"
    a_s, a_t = promote(student_attn, teacher_attn)
    if a_s.ndim != 4 or a_s.shape[:1] + a_s.shape[2:] != a_t.shape[:1] + a_t.shape[2:]:
        raise ValueError(f"{fn}: maps must be [B, H, T, S] alike but for H; got student "
                         f"{a_s.shape}, teacher {a_t.shape}")
    if a_s.shape[1] != a_t.shape[1]:
        a_s, a_t = (jnp.mean(a, axis=1, keepdims=True) for a in (a_s, a_t))  # [B, 1, T, S]
    keep = (jnp.ones(a_s.shape[:1] + a_s.shape[2:3], bool) if mask is None
            else jnp.asarray(mask).astype(bool))  # [B, T]
    if keep.shape != a_s.shape[:1] + a_s.shape[2:3]:
        raise ValueError(f"{fn}: mask {keep.shape} must be the maps' [B, T]")
    diff = a_s - jax.lax.stop_gradient(a_t)  # [B, H, T, S]
    per_query = jnp.mean(jnp.sum(diff * diff, axis=-1), axis=1)  # [B, T]
    per_query = jnp.where(keep, per_query, 0.0)
    if denominator is None:
        denominator = policy_loss_denominator(keep, "token-mean")
    return jnp.sum(per_query) / denominator, stopped_sums(a_s.dtype, tokens=keep)


def feature_loss(student_hidden: jax.Array, teacher_hidden: jax.Array, mask: jax.Array, *,
                 pool: str = "mean", kind: str = "l2", projection: jax.Array | None = None,
                 denominator: jax.Array | float | None = None) -> tuple[jax.Array, dict]:
    """Match hidden states: student [B, T, Ds], teacher [B, T, Dt], mask [B, T].

    projection [Ds, Dt] (the learned map when widths differ; required then) is applied to the
    student first. pool: "mean" (masked mean over T), "last" (the last real token) or "none"
    (every real token). kind: "l2" (mean over D of the squared difference) or "cosine"
    (1 - cos, each norm at least 1e-8 as in torch). The loss is the mean over items: real tokens
    for "none", rows with a real token otherwise (an empty row neither counts nor dilutes).
    Pooling comes before the projection: both are linear, so that equals projecting every token.
    Metrics (sums over items): tokens or sequences (the item count), cos_sum (cosine similarity).
    """
    fn = "feature_loss"
    check_choice(fn, "pool", pool, POOLS)
    check_choice(fn, "kind", kind, FEATURE_KINDS)
    extra = () if projection is None else (projection,)
    h_s, h_t, *extra = promote(student_hidden, teacher_hidden, *extra)
    keep = jnp.asarray(mask).astype(bool)  # [B, T]
    if h_s.shape[:-1] != h_t.shape[:-1] or keep.shape != h_s.shape[:-1]:
        raise ValueError(f"{fn}: hidden states {h_s.shape}, {h_t.shape} and mask {keep.shape} "
                         f"must share [B, T]")
    want = (h_s.shape[-1], h_t.shape[-1])
    if projection is None and want[0] != want[1]:
        raise ValueError(f"{fn}: widths differ ({want[0]} vs {want[1]}): pass a projection "
                         f"[{want[0]}, {want[1]}]")
    if extra and extra[0].shape != want:
        raise ValueError(f"{fn}: projection must be {list(want)}, got {extra[0].shape}")

    h_s = jnp.where(keep[..., None], h_s, 0.0)  # padding junk (even NaN) reaches nothing
    h_t = jnp.where(keep[..., None], jax.lax.stop_gradient(h_t), 0.0)
    if pool == "none":
        items = keep  # [B, T]
    else:
        items = jnp.any(keep, axis=-1)  # [B]
        if pool == "mean":
            count = jnp.maximum(jnp.sum(keep, axis=-1), 1).astype(h_s.dtype)[:, None]  # [B, 1]
            h_s, h_t = jnp.sum(h_s, axis=1) / count, jnp.sum(h_t, axis=1) / count  # [B, D]
        else:
            last = jnp.argmax(jnp.where(keep, jnp.arange(keep.shape[-1]), -1), axis=-1)  # [B]
            h_s, h_t = (jnp.take_along_axis(h, last[:, None, None], 1)[:, 0] for h in (h_s, h_t))
    if extra:
        h_s = h_s @ extra[0]  # [..., Ds] @ [Ds, Dt] -> [..., Dt]

    def norm(x):  # gradient-safe at 0: sqrt never sees less than eps²
        return jnp.sqrt(jnp.maximum(jnp.sum(x * x, axis=-1), _COS_EPS ** 2))

    cos = jnp.sum(h_s * h_t, axis=-1) / (norm(h_s) * norm(h_t))  # [B] or [B, T]
    per_item = jnp.mean((h_s - h_t) ** 2, axis=-1) if kind == "l2" else 1.0 - cos
    per_item = jnp.where(items, per_item, 0.0)
    if denominator is None:
        denominator = jnp.maximum(jnp.sum(items, dtype=jnp.int32), 1).astype(jnp.float32)
    name = "tokens" if pool == "none" else "sequences"
    metrics = stopped_sums(h_s.dtype, cos_sum=jnp.where(items, cos, 0.0), **{name: items})
    return jnp.sum(per_item) / denominator, metrics
