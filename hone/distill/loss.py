"""The distillation train loss: one student forward (logits plus the intermediate activations
asked for), the teacher's side from a forward in the same step or from cached top-k logits, and
the weighted sum of the token-level divergence, attention transfer and feature matching.

Sums and denominators: every term is a masked sum divided by a full-batch count (the
normalizer dict: "targets" = trained tokens, "tokens" = real tokens, "rows" = rows with a real
token), so micro-batches add up to the full batch's loss. The token divergence runs on the
trained (loss-mask) tokens; attention and features on every real token, the prompt included,
which is where most of the teacher's internal structure shows. Metrics are sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hone.losses.distill import attention_transfer_loss, feature_loss, topk_logits
from hone.models.head import distill_loss_chunked, over_chunks, token_logprobs_chunked


def normalizer(batch) -> dict:
    real = batch["attention_mask"]
    return {"targets": jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0).astype(jnp.float32),
            "tokens": jnp.maximum(jnp.sum(real), 1).astype(jnp.float32),
            "rows": jnp.maximum(jnp.sum(jnp.any(real > 0, axis=-1)), 1).astype(jnp.float32)}


def _norm(normalizer, name):
    # The eval step passes a plain 1.0: then every loss is a sum (only metrics are read).
    return normalizer[name] if isinstance(normalizer, dict) else normalizer


INPUT_KEYS = ("tokens", "positions", "attention_mask", "segment_ids")  # what a forward reads
NO_MAPS = {"hidden": (), "attention": ()}  # layer maps of a forward that needs logits only


def _inputs(mb):
    return {key: mb[key] for key in INPUT_KEYS[1:]}


def _identity(x):
    return x


def teacher_outputs(teacher_def, teacher_state, mb, maps, vocab=None):
    """The teacher's side: (head, head input, top-k or None, final hidden, activations), where
    head(head input chunk) gives the teacher's logits [B, c, V] over the student's vocabulary
    (the LM head runs over chunks of positions with the student's, `hone.models.head`). From
    `mb["teacher"]` when a teacher on its own devices computed them (its logits arrive whole:
    the head is the identity; or only its top-k: head and input are None), else a forward
    here."""
    if "teacher" in mb:
        t = mb["teacher"]
        topk = (t["values"], t["indices"]) if "values" in t else None
        logits = t.get("logits")
        return (None if logits is None else _identity, logits, topk, t["final"],
                {"hidden": t["hidden"], "attention": t["attention"]})
    head, final, caps = teacher_head_forward(teacher_def, teacher_state, mb, maps, vocab)
    return head, final, None, final, caps


def teacher_forward(teacher_def, teacher_state, mb, maps, vocab=None):
    """Teacher logits [B, T, V] (float32) and activations, with no gradient. With a vocabulary
    map ([Vs] teacher ids, -1 = none) the teacher reads the mapped ids and its logits come back
    over the student's vocabulary (-inf where the teacher has no counterpart)."""
    head, final, caps = teacher_head_forward(teacher_def, teacher_state, mb, maps, vocab)
    return head(final), final, caps


def teacher_head_forward(teacher_def, teacher_state, mb, maps, vocab=None):
    """(head, final hidden [B, T, Dt], activations) of the teacher, with no gradient: head(h)
    is the teacher's LM head on hidden states h [B, c, Dt] -> float32 logits [B, c, V] (over
    the student's vocabulary with a vocabulary map, as in teacher_forward)."""
    teacher = nnx.merge(teacher_def, jax.lax.stop_gradient(teacher_state))
    tokens = mb["tokens"]
    if vocab is not None:
        ids = jnp.asarray(vocab)
        tokens = jnp.maximum(ids[tokens], 0)  # unmapped ids only on padding (checked on load)
    final, caps = teacher.features(
        tokens, **_inputs(mb), hidden_layers=tuple(t for _, t in maps["hidden"]),
        attention_layers=tuple(t for _, t in maps["attention"]))

    def head(hidden):
        logits = teacher.logits_from_hidden(hidden)
        if vocab is not None:
            logits = jnp.where(ids >= 0, jnp.take(logits, jnp.maximum(ids, 0), axis=-1),
                               -jnp.inf)
        return logits

    return head, final, caps


def make_distill_loss(cfg, teacher_def, maps: dict, vocab=None):
    """loss_fn(student, mb, normalizer, key, aux) for make_train_step; aux is the teacher's
    state (None when the batch carries cached top-k logits)."""
    d = cfg.distill

    def loss_fn(student, mb, normalizer, key, aux):
        model = student.model
        final, caps = model.features(
            mb["tokens"], **_inputs(mb), hidden_layers=tuple(s for s, _ in maps["hidden"]),
            attention_layers=tuple(s for s, _ in maps["attention"]))
        chunk = model.head_chunk
        if "teacher_values" in mb:  # offline: the cache's top-k
            t_head, t_in, topk = None, None, (mb["teacher_values"], mb["teacher_indices"])
        else:
            t_head, t_in, topk, t_final, t_caps = teacher_outputs(teacher_def, aux, mb, maps,
                                                                  vocab)
            if d.top_k is not None and topk is None:
                topk = over_chunks(lambda h: topk_logits(t_head(h), d.top_k), t_in, chunk=chunk)
                t_head = t_in = None
        loss, metrics = distill_loss_chunked(
            model.logits_from_hidden, final, mb["loss_mask"], chunk=chunk, teacher_head=t_head,
            teacher_hidden=t_in, teacher_topk=topk, temperature=d.temperature, kind=d.kind,
            beta=d.beta, alpha=d.alpha, targets=mb["targets"] if d.alpha is not None else None,
            denominator=_norm(normalizer, "targets"))
        metrics["targets"] = metrics.pop("tokens")
        real = mb["attention_mask"]
        if d.attention_weight:
            total = 0.0
            for s, t in maps["attention"]:
                part, _ = attention_transfer_loss(caps["attention"][s], t_caps["attention"][t],
                                                  real, denominator=1.0)
                total = total + part
            metrics["attention_sum"] = jax.lax.stop_gradient(total)
            loss = loss + d.attention_weight * total / _norm(normalizer, "tokens")
        if d.feature_weight:
            pairs = maps["hidden"] or ((None, None),)
            total, cos, m = 0.0, 0.0, {}
            for i, (s, t) in enumerate(pairs):
                h_s = final if s is None else caps["hidden"][s]
                h_t = t_final if t is None else t_caps["hidden"][t]
                proj = student.projections[i].kernel[...] if len(student.projections) else None
                part, m = feature_loss(h_s, h_t, real, pool=d.feature_pool, kind=d.feature_kind,
                                       projection=proj, denominator=1.0)
                total, cos = total + part, cos + m["cos_sum"]
            metrics["feature_sum"] = jax.lax.stop_gradient(total)
            metrics["feature_cos_sum"] = cos / len(pairs)
            metrics["feature_items"] = m.get("tokens", m.get("sequences"))
            count = "tokens" if d.feature_pool == "none" else "rows"
            loss = loss + d.feature_weight * total / _norm(normalizer, count)
        metrics["real_tokens"] = jnp.sum(real).astype(jnp.float32)
        metrics["rows"] = jnp.sum(jnp.any(real > 0, axis=-1)).astype(jnp.float32)
        return loss, metrics

    return loss_fn


def make_eval_loss(teacher_def, vocab=None):
    """loss_fn for make_eval_step: held-out sums of KL(teacher || student) at temperature 1, the
    student's NLL, top-1 agreement and the cosine of the final hidden states (equal widths)."""

    def loss_fn(student, mb, normalizer, key, aux):
        model = student.model
        final = model.hidden(mb["tokens"], **_inputs(mb))
        t_head, t_in, _, t_final, _ = teacher_outputs(teacher_def, aux, mb, NO_MAPS, vocab)
        mask, chunk = mb["loss_mask"], model.head_chunk
        _, m = distill_loss_chunked(model.logits_from_hidden, final, mask, chunk=chunk,
                                    teacher_head=t_head, teacher_hidden=t_in, temperature=1.0,
                                    kind="forward_kl", alpha=0.0, targets=mb["targets"],
                                    denominator=1.0)
        out = {"targets": m["tokens"], "kl_sum": m["distill_sum"], "nll_sum": m["ce_sum"],
               "top1_agree_sum": m["top1_agree_sum"]}
        if final.shape[-1] == t_final.shape[-1]:
            _, f = feature_loss(final, t_final, mask, pool="none", kind="cosine",
                                denominator=1.0)
            out["cos_sum"] = f["cos_sum"]
        # The teacher's own NLL: the perplexity the student is chasing.
        nll = -token_logprobs_chunked(t_head, t_in, mb["targets"], chunk)
        out["teacher_nll_sum"] = jnp.sum(jnp.where(mask > 0, nll, 0.0))
        return jnp.float32(0.0), out

    return loss_fn


def train_means(row: dict, prefix: str = "") -> dict:
    """Per-token means of a logged row's sums."""
    p = prefix
    targets = max(float(row.get(p + "targets", 0.0)), 1.0)
    out = {}
    for name, key in (("distill", "distill_sum"), ("ce", "ce_sum"),
                      ("top1_agree", "top1_agree_sum"), ("kl", "kl_sum"), ("nll", "nll_sum"),
                      ("cos", "cos_sum"), ("teacher_nll", "teacher_nll_sum")):
        if p + key in row:
            out[p + name] = row[p + key] / targets
    if p + "attention_sum" in row:
        out[p + "attention"] = row[p + "attention_sum"] / max(row.get(p + "real_tokens", 1), 1)
    if p + "feature_sum" in row:
        out[p + "feature_cos"] = (row[p + "feature_cos_sum"]
                                  / max(row.get(p + "feature_items", 1), 1))
    return out
