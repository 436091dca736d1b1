"""The DPO-family objective of one micro-batch: policy (and reference) log-probs of each pair
through the model, then `hone.losses.preference`.

Chosen and rejected completions come as two rows per pair ([2B, T]: rows 0..B-1 chosen, B..2B-1
rejected) or as one shared-prefix row per pair (`hone.data.shared_prefix`). The reference's
log-probs come from the model with `hone.train.reference`'s mode, or precomputed in the batch.
Per-pair losses are summed over real pairs and divided by the whole batch's pair count, so
gradient accumulation equals one large batch. Shared by `hone dpo` and `hone bench dpo`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.config import DPOConfig
from hone.losses.preference import dpo_loss, orpo_loss, sequence_logprobs, simpo_loss
from hone.train.reference import reference_model
from hone.train.scoring import branch_logprobs, row_logprobs


def sequence_logps(model, mb):
    """Per-sequence summed and length-averaged completion log-probs [2B] (chosen, then
    rejected), and lengths; from either batch layout (two rows per pair, or one shared row)."""
    if "branch_ids" in mb:
        return shared_sequence_logps(model, mb)
    token_lp = row_logprobs(model, mb)[0]
    mask = mb["loss_mask"]
    return (sequence_logprobs(token_lp, mask), sequence_logprobs(token_lp, mask, average=True),
            jnp.sum(mask, axis=-1))


def shared_sequence_logps(model, mb):
    """The same from [prompt | chosen | rejected] rows (`hone.data.shared_prefix`)."""
    token_lp = branch_logprobs(model, mb)[0]                                 # [B, 2, K]
    mask = mb["score_mask"]
    seq, avg, lens = (sequence_logprobs(token_lp, mask),
                      sequence_logprobs(token_lp, mask, average=True), jnp.sum(mask, axis=-1))
    return tuple(jnp.concatenate([x[:, 0], x[:, 1]]) for x in (seq, avg, lens))


def make_dpo_loss(cfg: DPOConfig, mode: str | None):
    d = cfg.dpo

    def loss_fn(model, mb, normalizer, key, aux):
        seq, avg, lens = sequence_logps(model, mb)
        b = seq.shape[0] // 2
        valid = mb["pair_valid"]
        pc, pr = seq[:b], seq[b:]
        metrics = {"pairs": jnp.sum(valid)}
        if d.loss_type == "simpo":
            per_pair = jax.vmap(lambda c, r: simpo_loss(c, r, beta=d.beta,
                                                        gamma=d.simpo_gamma))(avg[:b], avg[b:])
        elif d.loss_type == "orpo":
            nll = -avg[:b]
            per_pair = jax.vmap(lambda c, r, n: orpo_loss(c, r, n, beta=d.beta))(
                avg[:b], avg[b:], nll)
        else:
            if mode == "precomputed":
                rc, rr = mb["ref_chosen_logp"], mb["ref_rejected_logp"]
            else:
                ref_seq, _, _ = sequence_logps(reference_model(model, mode, aux), mb)
                ref_seq = jax.lax.stop_gradient(ref_seq)
                rc, rr = ref_seq[:b], ref_seq[b:]
            # Data-distribution estimate of KL(policy || reference) per completion token.
            log_ratio = (pc - rc) + (pr - rr)
            metrics["kl_sum"] = jnp.sum(log_ratio * valid)
            metrics["completion_tokens"] = jnp.sum((lens[:b] + lens[b:]) * valid)
            if d.loss_type == "ipo":  # IPO compares length-averaged log-probs (as TRL does)
                lc, lr = jnp.maximum(lens[:b], 1.0), jnp.maximum(lens[b:], 1.0)
                pc, pr, rc, rr = pc / lc, pr / lr, rc / lc, rr / lr
            per_pair = jax.vmap(lambda a, b_, c, e: dpo_loss(
                a, b_, c, e, beta=d.beta, loss_type=d.loss_type,
                label_smoothing=d.label_smoothing))(pc, pr, rc, rr)
        losses, parts = per_pair
        for name in ("rewards_chosen", "rewards_rejected", "margin", "accuracy"):
            if name in parts:
                metrics[name + "_sum"] = jnp.sum(parts[name] * valid)
        return jnp.sum(losses * valid) / normalizer, metrics

    return loss_fn


def means(row: dict, prefix: str = "") -> dict:
    """Turn the summed metrics of a logged row into per-pair (and per-token) means."""
    pairs = max(float(row.get(prefix + "pairs", 0.0)), 1.0)
    out = {}
    for name in ("rewards_chosen", "rewards_rejected", "margin", "accuracy"):
        if prefix + name + "_sum" in row:
            out[prefix + name] = row[prefix + name + "_sum"] / pairs
    if prefix + "kl_sum" in row:
        out[prefix + "kl"] = row[prefix + "kl_sum"] / max(row[prefix + "completion_tokens"], 1.0)
    return out
