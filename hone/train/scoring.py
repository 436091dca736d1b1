"""The model's scores of shared-prefix rows (`hone.data.shared_prefix`): one forward pass over a
row [prompt | answer 1 | ... | answer A], read only at the slots that predict answer tokens.

DPO and the reward-free preference losses score [prompt | chosen | rejected] rows, GRPO and PPO
score tree rows [prompt | sample 1 | ... | sample G]; the policy, the reference and PPO's critic
all read their hidden states here, so every one of them sees the same slots. The LM head runs on
those slots only, so the prompt's [N, S, V] logits are never formed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.losses import token_logprobs


def branch_hidden(model, mb) -> jax.Array:
    """Rows of one shared prompt and several answers: one forward pass of `model` (a
    Transformer) over each row; its hidden states [N, A·K, D] at the slots that predict answer
    tokens (score_index [N, A, K])."""
    hidden = model.hidden(mb["tokens"], positions=mb["positions"],
                          attention_mask=mb["attention_mask"], segment_ids=mb["segment_ids"],
                          branch_ids=mb["branch_ids"])                        # [N, S, D]
    n, answers, width = mb["score_index"].shape
    return jnp.take_along_axis(hidden, mb["score_index"].reshape(n, answers * width, 1), axis=1)


def branch_logprobs(model, mb) -> tuple[jax.Array, jax.Array]:
    """The LM head on `branch_hidden` only: the logits [N, A·K, V] of the slots that predict
    answer tokens and the log-probabilities [N, A, K] of the answer tokens (score_targets;
    0-masked by score_mask where there is none)."""
    n, answers, width = mb["score_index"].shape
    logits = model.logits_from_hidden(branch_hidden(model, mb))              # [N, A·K, V]
    targets = mb["score_targets"].reshape(n, answers * width)
    return logits, token_logprobs(logits, targets).reshape(n, answers, width)
