"""The PPO objective of one micro-batch, and the scoring of a rollout before its updates.

The actor-critic's policy log-probs and values through one forward pass (`scored`), the clipped
policy loss and the clipped value loss of `hone.losses.rl`; `make_scoring` computes the old
log-probs and values, the reference log-probs and GAE advantages inside the jitted step (or on
the reference's own devices).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from hone.config import PPOConfig
from hone.losses.rl import gae, gae_over_mask, policy_loss, value_loss, whiten
from hone.rl.critic import ActorCritic
from hone.rl.policy_metrics import diagnostics
from hone.rl.rollout import flat_samples
from hone.rl.step import chunked
from hone.train.reference import reference_model
from hone.train.scoring import branch_logprobs, head_logprobs, row_logprobs
from hone.train.step import merge


_POLICY = "policy/"


def policy_part(flat: dict) -> dict:
    """The policy's entries of a flat parameter dict, keyed relative to the policy."""
    return {k[len(_POLICY):]: v for k, v in flat.items() if k.startswith(_POLICY)}


def scored(model: ActorCritic, mb, entropy: bool = False):
    """(log-probs of the targets, values, and with `entropy` the policy's entropy, else None) of
    a batch: [B, L] for rows, and for tree rows [groups·G, M] at the samples' slots only. The
    LM head runs over chunks of positions (`hone.train.scoring.head_logprobs`)."""
    if "branch_ids" not in mb:
        hidden, values = model.hidden_values(mb["tokens"], mb["positions"], mb["attention_mask"],
                                             mb.get("segment_ids"))
        logp, ent = head_logprobs(model.policy, hidden, mb["targets"], entropy)
        return logp, values, ent
    hidden, values = model.branch_slots(mb)
    n, g, m = mb["score_index"].shape
    logp, ent = head_logprobs(model.policy, hidden, mb["score_targets"].reshape(n, g * m),
                              entropy)
    flat = lambda x: None if x is None else x.reshape(n * g, m)  # noqa: E731
    return flat(logp), flat(values), flat(ent)


def last_token(mask: jax.Array) -> jax.Array:
    """1 at the last completion token of each row of a [B, L] mask."""
    nxt = jnp.concatenate([mask[:, 1:], jnp.zeros_like(mask[:, :1])], axis=1)
    return mask * (1.0 - nxt)


def make_ppo_loss(cfg: PPOConfig):
    ppo = cfg.ppo

    def loss_fn(model: ActorCritic, mb, normalizer, key, aux):
        logp, values, entropy = scored(model, mb, entropy=True)
        if "branch_ids" in mb:
            mb = flat_samples(mb)
        mask = mb["loss_mask"]
        pl, pm = policy_loss(logp, mb["old_logp"], mb["advantages"], mask,
                             clip_eps=ppo.clip_eps, agg="token-mean", denominator=normalizer)
        vl, vm = value_loss(values, mb["old_values"], mb["returns"], mask, clip=ppo.value_clip,
                            denominator=normalizer)
        metrics = dict(pm, **diagnostics(entropy, logp, mb),
                       value_clipped_sum=vm["value_clipped_sum"],
                       policy_loss=jax.lax.stop_gradient(pl),
                       value_loss=jax.lax.stop_gradient(vl))
        return pl + ppo.vf_coef * vl, metrics

    return loss_fn


def make_scoring(cfg: PPOConfig, graphdef, template, mode: str | None, remote: bool = False):
    """(score_rollout, finish) of the RL step (`make_rl_step`'s `score` and `finish`): the
    in-jit scoring of a rollout (old log-probabilities and values, the reference's
    log-probabilities, KL-shaped rewards, GAE) and the state's updates after the step (adaptive
    KL coefficient, EMA reference). `remote`: ref_logp arrives with the batch."""
    ppo, precision = cfg.ppo, cfg.train.precision

    def score_rollout(state, frozen, batch, aux):
        ref_params = {"copy": aux, "ema": state.get("ema"), "adapters_off": None,
                      None: None}[mode]

        tree = "branch_ids" in batch

        def score_chunk(mb):  # one micro-batch of rows
            model = merge(graphdef, template, state["params"], frozen, precision)
            logp, values, _ = scored(model, mb)
            if tree:  # back to the batch's [groups, G, M], so micro-batches concatenate
                logp, values = (x.reshape(mb["score_index"].shape) for x in (logp, values))
            out = {"old_logp": logp, "old_values": values}
            if mode is None:  # no KL term: no reference forward pass
                out["ref_logp"] = out["old_logp"]
            elif remote:  # computed on the reference's own devices
                out["ref_logp"] = mb["ref_logp"]
            else:
                ref = reference_model(model.policy, mode, ref_params)
                if tree:
                    out["ref_logp"] = branch_logprobs(ref, mb)[0]
                else:
                    out["ref_logp"] = row_logprobs(ref, mb)[0]
            return jax.lax.stop_gradient(out)

        out = chunked(score_chunk, batch, cfg.train.grad_accum)
        flat = flat_samples(dict(batch, **out)) if tree else dict(batch, **out)
        mask = flat["loss_mask"]
        kl = (flat["old_logp"] - flat["ref_logp"]) * mask  # [B, L] (tree rows: [B, M])
        if "turn_rewards" in flat:  # episodes: each turn's reward where the turn ends
            rewards = -state["kl_coef"] * kl + flat["turn_rewards"]
            adv, returns = gae_over_mask(rewards, flat["old_values"], mask,
                                         gamma=flat["turn_discount"], lam=ppo.lam)
        else:
            rewards = -state["kl_coef"] * kl + last_token(mask) * flat["scores"][:, None]
            adv, returns = gae(rewards, flat["old_values"], mask, gamma=ppo.gamma, lam=ppo.lam)
        if ppo.whiten_advantages:
            adv = whiten(adv, mask) * mask
        rows = jnp.maximum(jnp.sum(jnp.any(mask > 0, axis=1)), 1)
        tokens = jnp.maximum(jnp.sum(mask), 1)
        metrics = {"kl_seq": jnp.sum(kl) / rows, "kl_coef": state["kl_coef"],
                   "score_mean": jnp.mean(flat["scores"]),
                   "value_mean": jnp.sum(flat["old_values"] * mask) / tokens,
                   "return_mean": jnp.sum(returns * mask) / tokens}
        if tree:
            adv, returns = (x.reshape(batch["loss_mask"].shape) for x in (adv, returns))
        return dict(batch, **out, advantages=adv, returns=returns), metrics

    def finish(state, batch, metrics):
        if ppo.kl_target is not None:
            error = jnp.clip(metrics["kl_seq"] / ppo.kl_target - 1.0, -0.2, 0.2)
            n = batch["scores"].size  # completions (tree rows hold G per row)
            state = dict(state, kl_coef=state["kl_coef"] * (1.0 + error * n / ppo.kl_horizon))
        if mode == "ema":
            d = ppo.ema_decay
            policy = policy_part(state["params"])
            state = dict(state, ema={k: d * v + (1.0 - d) * policy[k]
                                     for k, v in state["ema"].items()})
        return state

    return score_rollout, finish
