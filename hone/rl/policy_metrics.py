"""Policy-update diagnostics: inside the step, the entropy of the policy and the gap between the
sampler's and the trainer's log-probabilities, as sums over completion tokens (so micro-batches
add up); on the host, the per-token means of those sums and of the policy loss's counts.

The sampler-versus-trainer gap measures numerics only (both sides are the model's own
distribution, `hone.rl.rollout`), which is what `grpo.tis_cap` corrects.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def diagnostics(entropy, logp, mb, window: tuple[int, int] | None = None) -> dict:
    """Entropy of the policy and the sampler-versus-trainer gap, as sums over completion tokens.
    entropy and logp [B, L] of rows (`hone.train.scoring.head_logprobs`); with a `window`
    (start, width) the entropy is that of the window's slots only ([B, width]) while logp stays
    [B, L]."""
    mask = mb["loss_mask"]
    entropy = jax.lax.stop_gradient(entropy)
    entropy_mask = mask if window is None else mask[:, window[0]:window[0] + window[1]]
    gap = (jax.lax.stop_gradient(logp) - mb["sampler_logp"]) * mask
    return {"entropy_sum": jnp.sum(entropy * entropy_mask),
            "sampler_gap_sum": jnp.sum(jnp.abs(gap)), "sampler_gap_sq_sum": jnp.sum(gap * gap)}


def policy_means(row: dict) -> dict:
    """Per-token means of the summed policy-loss metrics of a logged row."""
    tokens = max(float(row.get("tokens", 0.0)), 1.0)
    out = {}
    for name, key in (("clip_fraction", "clipped_sum"), ("clip_low_fraction", "clipped_low_sum"),
                      ("clip_high_fraction", "clipped_high_sum"), ("ratio_mean", "ratio_sum"),
                      ("kl", "kl_sum"), ("entropy", "entropy_sum"),
                      ("sampler_gap", "sampler_gap_sum"),
                      ("value_clip_fraction", "value_clipped_sum")):
        if key in row:
            out[name] = row[key] / tokens
    for name, key in (("offpolicy_k3", "offpolicy_k3_sum"),
                      ("tis_clip_fraction", "tis_clipped_sum"),
                      ("token_masked_fraction", "token_masked_sum")):
        if key in row:
            out[name] = row[key] / tokens
    if "seq_masked_sum" in row:
        out["seq_masked_fraction"] = row["seq_masked_sum"] / max(float(row.get("seqs", 0)), 1.0)
    if "sampler_gap_sq_sum" in row:
        out["sampler_gap_rms"] = float(np.sqrt(row["sampler_gap_sq_sum"] / tokens))
    return out
