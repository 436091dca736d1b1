"""The model's log-probabilities of training rows through its LM head (`head_logprobs`, run over
chunks of model.head_chunk positions): whole rows (`row_logprobs`), and shared-prefix rows
(`hone.data.shared_prefix`): one forward pass over a row [prompt | answer 1 | ... | answer A],
read only at the slots that predict answer tokens (`branch_logprobs`).

DPO and the reward-free preference losses score [prompt | chosen | rejected] rows, GRPO and PPO
score tree rows [prompt | sample 1 | ... | sample G]; the policy, the reference and PPO's critic
all read their hidden states here, so every one of them sees the same slots. The LM head runs on
those slots only, so the prompt's [N, S, V] logits are never formed, and over chunks of
positions (`hone.models.head`), so neither are a long answer's.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.models.head import token_logprobs_and_entropy, token_logprobs_chunked


# A vision-language model's image inputs, when a batch carries them (hone.data.vision).
IMAGE_KEYS = ("pixel_values", "pixel_attention_mask")


def branch_hidden(model, mb) -> jax.Array:
    """Rows of one shared prompt and several answers: one forward pass of `model` (a
    Transformer) over each row; its hidden states [N, A·K, D] at the slots that predict answer
    tokens (score_index [N, A, K])."""
    images = {key: mb[key] for key in IMAGE_KEYS if key in mb}
    hidden = model.hidden(mb["tokens"], positions=mb["positions"],
                          attention_mask=mb["attention_mask"], segment_ids=mb["segment_ids"],
                          branch_ids=mb["branch_ids"], **images)              # [N, S, D]
    n, answers, width = mb["score_index"].shape
    return jnp.take_along_axis(hidden, mb["score_index"].reshape(n, answers * width, 1), axis=1)


def head_logprobs(model, hidden: jax.Array, targets: jax.Array, entropy: bool = False):
    """The LM head of `model` on hidden [B, T, D]: log-probabilities of the targets [B, T], and
    with `entropy` the entropy [B, T] of each position's distribution (a diagnostic, no
    gradient), else None. Rows longer than model.head_chunk positions are scored chunk by chunk
    (`hone.models.head`): their whole [B, T, V] logits are never formed."""
    if entropy:
        return token_logprobs_and_entropy(model.logits_from_hidden, hidden, targets,
                                          model.head_chunk)
    return token_logprobs_chunked(model.logits_from_hidden, hidden, targets,
                                  model.head_chunk), None


def row_logprobs(model, mb, entropy: bool = False):
    """`head_logprobs` of whole rows: (log-probs [B, L] of mb["targets"], entropy or None).
    A batch with images (IMAGE_KEYS) hands them to the model with the tokens."""
    images = {key: mb[key] for key in IMAGE_KEYS if key in mb}
    hidden = model.hidden(mb["tokens"], positions=mb["positions"],
                          attention_mask=mb["attention_mask"], segment_ids=mb.get("segment_ids"),
                          **images)
    return head_logprobs(model, hidden, mb["targets"], entropy)


def branch_logprobs(model, mb, entropy: bool = False):
    """The LM head on `branch_hidden` only: the log-probabilities [N, A, K] of the answer tokens
    (score_targets; 0-masked by score_mask where there is none), and with `entropy` the entropy
    [N, A, K] at those slots, else None."""
    n, answers, width = mb["score_index"].shape
    targets = mb["score_targets"].reshape(n, answers * width)
    logp, ent = head_logprobs(model, branch_hidden(model, mb), targets, entropy)
    shape = (n, answers, width)
    return logp.reshape(shape), None if ent is None else ent.reshape(shape)
