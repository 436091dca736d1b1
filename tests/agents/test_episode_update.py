"""One GRPO update on episodes (a row per episode, the loss on the model's turns) equals the
same update computed from the episodes laid out turn by turn (a row per model turn: the history
before it as the prompt, the turn as the completion), to 1e-5: the masks, the shifted targets,
the sampler's log-probabilities and the aggregation line up with the single-turn layout."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from hone.agents.episode_rows import episode_rows
from hone.agents.rollout import rollout
from hone.losses.rl import policy_loss, policy_loss_denominator
from hone.rl.rollout import Samples, pack_rows
from hone.sampling.generate import Completion
from hone.train.scoring import head_logprobs
from scripted import EXAMPLES, KW, Counter


def turn_rows(episodes, pad_id):
    """A row per model turn: (rows, index of the episode each row comes from)."""
    prompts, completions, owner = [], [], []
    for e, ep in enumerate(episodes):
        mask = ep.model_mask
        starts = [k for k in range(len(mask)) if mask[k] and not mask[k - 1]]
        for start, end in zip(starts, ep.turn_ends):
            prompts.append(ep.tokens[:start])
            completions.append(Completion(None, ep.tokens[start:end + 1],
                                          ep.logprobs[start:end + 1]))
            owner.append(e)
    p = max(map(len, prompts))
    m = max(len(c.tokens) for c in completions)
    rows = pack_rows(Samples(prompts, [""] * len(prompts), completions, {}, 1), p, m, pad_id)
    return rows, np.asarray(owner)


def loss_and_grads(model, rows, adv):
    graphdef, params = nnx.split(model)

    def loss(params):
        m = nnx.merge(graphdef, params)
        hidden = m.hidden(rows["tokens"], positions=rows["positions"],
                          attention_mask=rows["attention_mask"])
        logp, _ = head_logprobs(m, hidden, rows["targets"])
        old = jax.lax.stop_gradient(logp)
        weights = jnp.minimum(jnp.exp(old - rows["sampler_logp"]), 2.0)  # TIS reads the sampler
        value, _ = policy_loss(logp, old + 0.05 * rows["loss_mask"], adv, rows["loss_mask"],
                               agg="token-mean", is_weights=weights,
                               denominator=policy_loss_denominator(rows["loss_mask"]))
        return value

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("group", [2])
def test_an_update_on_episodes_equals_the_update_on_their_turns(tiny, group):
    model, tok = tiny
    episodes = rollout(model, tok, Counter, EXAMPLES[1:4], seed=9, group_size=group, **KW)
    assert sum(ep.turns for ep in episodes) > len(episodes)  # several turns per episode
    adv = np.linspace(-1.0, 1.5, len(episodes)).astype(np.float32)
    p = max(ep.prompt_len for ep in episodes)
    ep_rows = episode_rows(episodes, p, p + max(len(ep.tokens) - ep.prompt_len
                                                for ep in episodes), tok.pad_id)
    by_turn, owner = turn_rows(episodes, tok.pad_id)
    assert ep_rows["loss_mask"].sum() == by_turn["loss_mask"].sum()
    keep = ("tokens", "positions", "attention_mask", "targets", "loss_mask", "sampler_logp")
    a_loss, a_grads = loss_and_grads(model, {k: ep_rows[k] for k in keep}, adv)
    b_loss, b_grads = loss_and_grads(model, {k: by_turn[k] for k in keep}, adv[owner])
    assert abs(float(a_loss) - float(b_loss)) <= 1e-5
    flat_a, flat_b = jax.tree.leaves(a_grads), jax.tree.leaves(b_grads)
    assert max(float(jnp.max(jnp.abs(x - y))) for x, y in zip(flat_a, flat_b)) <= 1e-5
    assert max(float(jnp.max(jnp.abs(x))) for x in flat_a) > 1e-3  # a real gradient
