"""One GRPO or PPO update with plain SGD, for tests that compute the same update two ways."""

import jax
import optax
from flax import nnx

from hone.losses.rl import policy_loss_denominator
from hone.models.transformer import Transformer
from hone.recipes import ppo
from hone.rl.critic import build_actor_critic
from hone.rl.grpo_objective import make_grpo_loss, make_scoring
from hone.rl.step import make_rl_step
from hone.train.state import flatten, new_train_state, split_model


def sgd_update(cfg, arch, batch) -> tuple[dict, dict]:
    """(parameter deltas, metrics) of one GRPO update (cfg's loss and train.grad_accum) of a
    fresh model of `arch` (seed 0) on `batch`, with a copied reference 0.01 off the policy.

    Plain SGD at 1e4: the update is the gradient, scaled so far above the weights that the
    float32 sum weight + update keeps the update's own precision (Adam divides each gradient by
    its own size: rounding on a near-zero gradient would flip its sign). One update even with
    grpo.iterations > 1, which stores old log-probabilities first: a second update would start
    from SGD-scaled weights."""
    model = Transformer(arch, rngs=nnx.Rngs(0))
    graphdef, params, frozen = split_model(model, nnx.Param)
    opt, sched = optax.sgd(1e4), optax.constant_schedule(1e4)
    state = new_train_state(flatten(params), opt, 0)
    start = jax.device_get(state["params"])
    aux = jax.tree.map(lambda x: x + 0.01, state["params"])
    grpo = cfg.grpo
    step = make_rl_step(graphdef, params, make_grpo_loss(cfg),
                        lambda b: policy_loss_denominator(b["loss_mask"], grpo.loss_agg,
                                                          max_len=grpo.max_new_tokens),
                        opt, sched, accum=cfg.train.grad_accum, precision="fp32", epochs=1,
                        score=make_scoring(cfg, graphdef, params, "copy"))
    state, metrics = step(state, frozen, batch, aux)
    new = jax.device_get(state["params"])
    return {k: new[k] - start[k] for k in new}, jax.device_get(metrics)


def ppo_sgd_update(cfg, arch, batch) -> tuple[dict, dict]:
    """(parameter deltas, metrics) of one PPO update (epochs 1, one minibatch) as sgd_update
    makes a GRPO one: a fresh ActorCritic of `arch` (seed 0; cfg's critic; a random value head),
    kl_coef from cfg, a copied reference 0.01 off the policy."""
    import jax.numpy as jnp
    model = build_actor_critic(Transformer(arch, rngs=nnx.Rngs(0)), cfg.ppo.critic, 0)
    # A value head off zero (where it starts), so gradients reach a separate critic's backbone.
    head = model.value_head.kernel
    head[...] = 0.1 * jax.random.normal(jax.random.key(1), head[...].shape)
    graphdef, params, frozen = split_model(model, nnx.Param)
    opt, sched = optax.sgd(1e4), optax.constant_schedule(1e4)
    state = new_train_state(flatten(params), opt, 0)
    state["kl_coef"] = jnp.float32(cfg.ppo.kl_coef)
    start = jax.device_get(state["params"])
    aux = jax.tree.map(lambda x: x + 0.01, ppo.policy_part(state["params"]))
    score, finish = ppo.make_scoring(cfg, graphdef, params, "copy")
    step = make_rl_step(graphdef, params, ppo.make_ppo_loss(cfg),
                        lambda b: jnp.maximum(jnp.sum(b["loss_mask"]), 1.0), opt, sched,
                        accum=cfg.train.grad_accum, precision="fp32", epochs=1,
                        score=score, finish=finish)
    state, metrics = step(state, frozen, batch, aux)
    new = jax.device_get(state["params"])
    return {k: new[k] - start[k] for k in new}, jax.device_get(metrics)
