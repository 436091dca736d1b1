"""A reward model: the transformer backbone plus a scalar head read at the last real token.

The layout is the one Hugging Face's `*ForSequenceClassification` (num_labels=1) uses: the
final-normed hidden state of the last non-padding token times a [D, 1] `score` matrix, no bias.
So a trained reward model exports as a folder transformers loads with
AutoModelForSequenceClassification (hone/weights/hf_reward.py writes and reads it).
"""

from __future__ import annotations


import jax
import jax.numpy as jnp
from flax import nnx

from hone.models.linear import Linear
from hone.models.transformer import Transformer

class RewardModel(nnx.Module):
    """tokens [B, T] -> rewards [B] (float32)."""

    def __init__(self, backbone: Transformer, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.backbone = backbone
        self.config = backbone.config
        dtype = backbone.embedder.embedding[...].dtype
        self.head = Linear((self.config.hidden_size,), (1,), ("embed", "score"), dtype, rngs)

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        hidden = self.backbone.hidden(tokens, positions, attention_mask, segment_ids)
        b, t = tokens.shape
        valid = (jnp.ones((b, t), jnp.bool_) if attention_mask is None
                 else attention_mask.astype(jnp.bool_))
        # The rightmost real token (padding may sit on either side).
        last = jnp.max(jnp.where(valid, jnp.arange(t)[None, :], 0), axis=1)
        picked = hidden[jnp.arange(b), last]  # [B, D]
        return self.head(picked)[:, 0].astype(jnp.float32)

    def branch_rewards(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                       segment_ids: jax.Array, branch_ids: jax.Array,
                       branches: int = 2) -> jax.Array:
        """Rewards [B, branches] of rows holding one shared prompt and several answers
        (`hone.data.shared_prefix`; branch_ids 1..branches): each read at its answer's last
        token, which sees the prompt and that answer only, so it equals the reward of the
        prompt + answer row alone."""
        hidden = self.backbone.hidden(tokens, positions, attention_mask, segment_ids,
                                      branch_ids=branch_ids)
        b, t = tokens.shape
        slots = jnp.arange(t)[None, None, :]
        mine = ((branch_ids[:, None, :] == jnp.arange(1, branches + 1)[None, :, None])
                & attention_mask.astype(jnp.bool_)[:, None, :])   # [B, branches, T]
        last = jnp.max(jnp.where(mine, slots, 0), axis=2)        # [B, branches]
        picked = jnp.take_along_axis(hidden, last[..., None], axis=1)  # [B, branches, D]
        return self.head(picked)[..., 0].astype(jnp.float32)
