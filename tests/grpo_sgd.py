"""One GRPO update with plain SGD, for tests that compute the same update two ways."""

import jax
import optax
from flax import nnx

from hone.losses.rl import policy_loss_denominator
from hone.models.transformer import Transformer
from hone.recipes.grpo import make_grpo_loss, make_prepare
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
    g = cfg.grpo
    step = make_rl_step(graphdef, params, make_grpo_loss(cfg),
                        lambda b: policy_loss_denominator(b["loss_mask"], g.loss_agg,
                                                          max_len=g.max_new_tokens),
                        opt, sched, accum=cfg.train.grad_accum, precision="fp32", epochs=1,
                        prepare=make_prepare(cfg, graphdef, params, "copy"))
    state, metrics = step(state, frozen, batch, aux)
    new = jax.device_get(state["params"])
    return {k: new[k] - start[k] for k in new}, jax.device_get(metrics)
