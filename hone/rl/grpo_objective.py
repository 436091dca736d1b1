"""The GRPO objective of one micro-batch, and the scoring of a rollout before its updates.

`make_grpo_loss` runs the policy over rollout rows (or tree rows: one prompt per group) and
feeds `hone.losses.rl` (clipped policy loss, CISPO, KL to the reference, truncated importance
weights); `make_scoring` computes the old and reference log-probs inside the jitted step when
the loss needs them. Shared by `hone grpo` and `hone bench grpo`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.config import GRPOConfig
from hone.losses.rl import cispo_loss, offpolicy_weights, policy_loss
from hone.rl.policy_metrics import diagnostics
from hone.rl.rollout import completion_width, flat_samples
from hone.rl.step import chunked
from hone.train.reference import reference_model
from hone.train.scoring import branch_logprobs, head_logprobs
from hone.train.step import merge


def completion_window(cfg) -> tuple[int, int]:
    """(start, width): the slots of a rollout row (`hone.rl.rollout.pack_rows`: prompts
    left-padded to P = max_prompt_tokens) whose logits predict completion tokens: P-1 .. P+M-2."""
    return getattr(cfg, cfg.SECTION).max_prompt_tokens - 1, completion_width(cfg)


def model_logp(model, mb, window: tuple[int, int] | None = None, entropy: bool = False):
    """Log-probabilities of the targets [B, L] and, with `entropy`, the policy's entropy at the
    scored slots (else None). With a `window` (start, width) the LM head runs on those slots
    only: the entropy is [B, width] and logp is 0 outside them (the prompt's slots, which no
    loss reads), so the prompt's [B, P, V] logits are never formed; the head runs over chunks
    of model.head_chunk positions (`hone.train.scoring.head_logprobs`)."""
    hidden = model.hidden(mb["tokens"], positions=mb["positions"],
                          attention_mask=mb["attention_mask"],
                          segment_ids=mb.get("segment_ids"))                 # [B, L, D]
    if window is None:
        return head_logprobs(model, hidden, mb["targets"], entropy)
    start, width = window
    rows, length = mb["tokens"].shape
    if length != start + 1 + width:
        raise ValueError(f"model_logp: rows of {length} tokens are not rollout rows of "
                         f"{start + 1} prompt + {width} completion slots")
    logp, ent = head_logprobs(model, hidden[:, start:start + width],
                              mb["targets"][:, start:start + width], entropy)
    return jnp.pad(logp, ((0, 0), (start, length - start - width))), ent


def tree_logp(model, mb, entropy: bool = False):
    """From tree rows (`hone.rl.rollout.pack_tree_rows`): log-probs [B, M] of every sample's
    tokens and, with `entropy`, the entropy [B, M] at their slots (else None); B = groups x G
    in the rows layout's order (sample j of group k is row k·G + j); the prompt is computed
    once per group (`branch_logprobs`)."""
    logp, ent = branch_logprobs(model, mb, entropy)
    groups, g, m = logp.shape
    return logp.reshape(groups * g, m), None if ent is None else ent.reshape(groups * g, m)


def make_grpo_loss(cfg: GRPOConfig):
    grpo = cfg.grpo
    window = completion_window(cfg)
    max_len = completion_width(cfg)

    def loss_fn(model, mb, normalizer, key, aux):
        if "branch_ids" in mb:  # tree rows: from here on, everything is [B, M]
            (logp, entropy), mb, win = tree_logp(model, mb, True), flat_samples(mb), None
        else:
            (logp, entropy), win = model_logp(model, mb, window, True), window
        old = mb["old_logp"] if "old_logp" in mb else jax.lax.stop_gradient(logp)
        # Corrections for a sampler other than the trainer (policy lag, numerics) and the
        # metrics of that gap: hone.losses.rl.offpolicy_weights.
        weights, off = offpolicy_weights(old, mb["sampler_logp"], mb["loss_mask"],
                                         tis_cap=grpo.tis_cap, token_band=grpo.icepop_band,
                                         seq_band=grpo.seq_mask_band)
        if grpo.loss_type == "cispo":  # the config allows token ratios, no KL, no corrections
            cap = {} if grpo.clip_eps_high is None else {"clip_eps_high": grpo.clip_eps_high}
            loss, metrics = cispo_loss(logp, old, mb["advantages"], mb["loss_mask"],
                                       agg=grpo.loss_agg, denominator=normalizer, **cap)
            return loss, dict(metrics, **off, **diagnostics(entropy, logp, mb, win))
        loss, metrics = policy_loss(
            logp, old, mb["advantages"], mb["loss_mask"], clip_eps=grpo.clip_eps,
            clip_eps_high=grpo.clip_eps_high, ref_logp=mb.get("ref_logp"), kl_beta=grpo.beta,
            kl_kind=grpo.kl_kind, agg=grpo.loss_agg, ratio=grpo.ratio,
            max_len=max_len, is_weights=weights, denominator=normalizer)
        return loss, dict(metrics, **off, **diagnostics(entropy, logp, mb, win))

    return loss_fn


def make_scoring(cfg: GRPOConfig, graphdef, template, mode: str | None):
    """The in-jit scoring of a rollout, `score_rollout(state, frozen, batch, aux) -> (batch,
    metrics)` (`make_rl_step`'s `score`): old and reference log-probabilities, as needed; None
    when the loss needs neither."""
    grpo = cfg.grpo
    need_old = grpo.iterations > 1
    if not need_old and mode is None:
        return None
    precision = cfg.train.precision
    window = completion_window(cfg)

    def logp_of(model, mb):  # [B, L] rows, or [groups, G, M] for tree rows
        if "branch_ids" in mb:
            return branch_logprobs(model, mb)[0]
        return model_logp(model, mb, window)[0]

    def score_rollout(state, frozen, batch, aux):
        def score_chunk(mb):  # one micro-batch of rows
            model = merge(graphdef, template, state["params"], frozen, precision)
            out = {}
            if need_old:
                out["old_logp"] = logp_of(model, mb)
            if mode is not None:
                out["ref_logp"] = logp_of(reference_model(model, mode, aux), mb)
            return jax.lax.stop_gradient(out)

        return dict(batch, **chunked(score_chunk, batch, cfg.train.grad_accum)), {}

    return score_rollout
