"""PPO's model: the policy plus a value head, on the policy's own backbone or on a separate one.

`ActorCritic(policy, critic=None)(tokens, positions, attention_mask) -> (logits [B, L, V],
values [B, L])`. values[:, t] is the critic's estimate for the state "tokens up to t", the state
in which targets[t] is chosen, so it lines up with the log-probability of targets[t].

Design choices:
- Shared (critic=None): one backbone pass feeds both the LM head and the value head, the cheap
  option (TRL calls it a value head model).
- Separate: a second backbone, initialised as a copy of the policy's (with its own adapters when
  training LoRA), so the value loss cannot pull on the policy's features.
- The value head is a [D, 1] `Linear` with logical names (embed, score) like the reward head.
- The policy stays a plain `Transformer` attribute, so the sampler and `hone export` use it as is,
  and the reference is built from it by the one rule every command shares
  (`hone.train.reference.reference_model(model.policy, ...)`).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hone.models.linear import Linear
from hone.models.transformer import Transformer
from hone.train.build import build_model
from hone.train.scoring import branch_hidden
from hone.train.state import also_train


class ActorCritic(nnx.Module):
    def __init__(self, policy: Transformer, critic: Transformer | None = None, *,
                 rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.policy = policy
        self.critic = critic
        self.config = policy.config
        dtype = policy.embedder.embedding[...].dtype
        self.value_head = Linear((self.config.hidden_size,), (1,), ("embed", "score"), dtype,
                                 rngs)
        # Values start at 0: a random head would add noise of the hidden states' scale to
        # every advantage of the first steps.
        self.value_head.kernel[...] = jnp.zeros_like(self.value_head.kernel[...])

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        hidden, values = self.hidden_values(tokens, positions, attention_mask)
        return self.policy.logits_from_hidden(hidden), values  # [B, L, V], [B, L]

    def hidden_values(self, tokens: jax.Array, positions: jax.Array | None = None,
                      attention_mask: jax.Array | None = None,
                      segment_ids: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """The policy's final hidden states [B, L, D] (for its LM head, which a loss may run
        over chunks of positions) and the values [B, L]; segment_ids: packed segments
        (episode rows), each attending to itself only."""
        hidden = self.policy.hidden(tokens, positions, attention_mask, segment_ids)  # [B, L, D]
        critic = hidden if self.critic is None else self.critic.hidden(
            tokens, positions, attention_mask, segment_ids)
        return hidden, self.value_head(critic)[..., 0].astype(jnp.float32)

    def branch_slots(self, mb) -> tuple[jax.Array, jax.Array]:
        """From tree rows (`hone.rl.rollout.pack_tree_rows`): the policy's hidden states
        [N, A·K, D] and the values [N, A, K] at the slots that predict each sample's tokens
        (`score_index`), the prompt computed once per row; the value at a slot lines up with
        the token it predicts, as in __call__."""
        hidden = branch_hidden(self.policy, mb)  # [N, A·K, D]
        critic = hidden if self.critic is None else branch_hidden(self.critic, mb)
        values = self.value_head(critic)[..., 0].astype(jnp.float32)
        return hidden, values.reshape(mb["score_index"].shape)


def build_actor_critic(policy: Transformer, critic: str, seed: int) -> ActorCritic:
    """`critic` "shared" or "separate" (a copy of the policy's backbone, adapters included)."""
    other = None
    if critic == "separate":
        # Fresh buffers: a clone shares the policy's arrays, and the train state (donated to
        # every step) must not hold one buffer twice.
        graphdef, state = nnx.split(policy)
        other = nnx.merge(graphdef, jax.tree.map(jnp.copy, state))
    return ActorCritic(policy, other, rngs=nnx.Rngs(seed))


def build_ppo_model(cfg, layout=None):
    """(ActorCritic, its trainable filter, the policy's own trainable filter) of a PPO config:
    the policy as every command builds it (`hone.train.build.build_model`), the value head
    always trained beside it."""
    policy, policy_trainable = build_model(cfg, layout=layout)
    model = build_actor_critic(policy, cfg.ppo.critic, cfg.train.seed)
    return model, also_train(policy_trainable, "value_head"), policy_trainable
