"""The SFT objective of one micro-batch: the model's masked next-token NLL.

What `hone sft`'s jitted step differentiates, `hone eval perplexity` sums and `hone bench sft`
times: the forward pass (packed rows attend within their documents; the LM head over chunks of
positions) feeding `hone.losses.sft`. It sits in train/ so that each of them imports it from
below, never from the recipe.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hone.losses.sft import sft_loss_from_logprobs
from hone.train.scoring import row_logprobs


def sft_step_loss(model, mb, normalizer, key, aux=None):
    """Masked next-token NLL of one micro-batch (packed rows attend within their documents); the
    LM head runs over chunks of model.head_chunk positions."""
    return sft_loss_from_logprobs(row_logprobs(model, mb)[0], mb["loss_mask"], normalizer)


def target_tokens(batch) -> jax.Array:
    return jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)


def sft_eval_means(total: dict) -> dict:
    """Held-out loss (token-weighted) and perplexity from summed eval metrics."""
    loss = total["eval_nll_sum"] / max(total["eval_target_tokens"], 1.0)
    return {"eval_loss": loss, "eval_ppl": float(np.exp(min(loss, 50.0)))}
