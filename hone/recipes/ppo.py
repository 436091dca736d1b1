"""`hone ppo`: PPO with a critic, a per-token KL penalty in the reward, and GAE.

Each step: sample completions with the current policy, score each with the reward functions
(the score lands on the completion's last token), then one jitted program
1. runs the policy, critic and reference over the rollout without gradients: old log-probs,
   old values, reference log-probs;
2. shapes the per-token reward r_t = -kl_coef * (logp_old - logp_ref)_t (+ the score at the last
   token), computes GAE advantages and returns, and whitens the advantages over the rollout;
3. runs `epochs x minibatches` clipped updates of policy loss + vf_coef * clipped value loss;
4. updates the adaptive KL coefficient (Ziegler et al.: kl_coef *= 1 + clip(KL/target - 1,
   -0.2, 0.2) * B / horizon) and the EMA reference, both part of the checkpointed state.

With `ppo.shared_prompt` (the default) a rollout is laid out as GRPO's tree rows, one row per
prompt group with the prompt computed once; the per-sample arrays ([groups, G, M] in the batch,
so minibatches draw whole groups) are flattened to [groups·G, M] for the KL-shaped rewards, GAE
and the losses, which are then those of a row per sample.

With `ppo.reference_devices: N` the reference runs on the last N devices instead
(`RemoteReference`) and its log-probabilities arrive with the batch. The EMA stays in the
policy's state (it is checkpointed there); its weights are sent to the reference's devices
before each step, the weight transfer a reference that changes calls for.
"""

from __future__ import annotations

from dataclasses import replace

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.config import PPOConfig
from hone.data.shared_prefix import work_tokens
from hone.parallel import logical_names
from hone.rl.critic import build_ppo_model
from hone.rl.policy_metrics import policy_means
from hone.rl.ppo_objective import make_ppo_loss, make_scoring, policy_part
from hone.rl.prompts import load_prompts
from hone.rl.remote_reference import RemoteReference, reference_split
from hone.rl.rollout import completion_width, tree_layout
from hone.rl.rollout_devices import place_rollouts, rollout_split
from hone.rl.rollouts import make_rollouts, rollout_scorer
from hone.rl.step import make_rl_step
from hone.tokenizer import load_tokenizer
from hone.train.build import make_layout, open_run
from hone.train.lagged import lagged
from hone.train.loop import LoopSpec, run_loop
from hone.train.optimizer import rl_optimizer
from hone.train.reference import reference_mode
from hone.train.state import new_train_state, split_model, train_params, tree_bytes, unflatten













def run_ppo(cfg: PPOConfig, *, log=print):
    """Train per cfg; returns (trained ActorCritic, final train state, evaluate(params) or None)."""
    ppo = cfg.ppo
    tokenizer = load_tokenizer(cfg.model.source)
    prompts, held_out = load_prompts(cfg, ppo, tokenizer, log)
    scorer = rollout_scorer(cfg, ppo, prompts, log)  # checked before the run is written
    ref_devices, policy_devices = reference_split(cfg)
    rollout_devices, policy_devices = rollout_split(cfg, ppo, policy_devices)
    layout = make_layout(cfg, devices=policy_devices)
    model, trainable, policy_trainable = build_ppo_model(cfg, layout)
    policy = model.policy
    run_dir = open_run(cfg)

    mode = reference_mode(cfg)
    layout.place_model(model)
    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = rl_optimizer(cfg.train, ppo.epochs * ppo.minibatches)
    state = new_train_state(train_params(model, params), optimizer, cfg.train.seed)
    state["kl_coef"] = jnp.float32(ppo.kl_coef)
    start = {k: jnp.copy(v) for k, v in policy_part(state["params"]).items()}
    aux = start if mode == "copy" and not ref_devices else None
    if mode == "ema":
        state["ema"] = start
    state = layout.place_train_state(state, logical_names(params))
    # The sampler and the reference see only the policy: its graph, trainable weights and rest.
    pol_graphdef, pol_params, pol_frozen = split_model(policy, policy_trainable)
    reference = None
    if ref_devices:
        reference = RemoteReference(cfg, pol_graphdef, pol_params, pol_frozen, mode, start,
                                    ref_devices)
        where = reference.describe()
    else:
        extra = tree_bytes(start) if mode in ("copy", "ema") else 0
        where = f"({extra / 2**20:.1f} MiB of extra weights)"
    del start  # "copy" on its own devices: no copy stays on the policy's
    log(f"reference: {mode or 'none (no KL term)'} {where}; critic: {ppo.critic}")
    score_fn, finish_fn = make_scoring(cfg, graphdef, params, mode,
                                      remote=reference is not None)
    step = make_rl_step(
        graphdef, params, make_ppo_loss(cfg),
        lambda b: jnp.maximum(jnp.sum(b["loss_mask"]), 1.0), optimizer, schedule,
        accum=cfg.train.grad_accum, precision=cfg.train.precision, epochs=ppo.epochs,
        minibatches=ppo.minibatches, score=score_fn, finish=finish_fn, layout=layout)

    groups = cfg.train.batch_size // ppo.group_size
    tree = tree_layout(cfg, shards=layout.shards, minibatches=ppo.minibatches)
    data_iter = prompts.iterator(groups, cfg.train.seed)
    # Episodes' rows carry per-turn rewards and discounts (agent.gamma between turns).
    rollouts = make_rollouts(cfg, ppo, pol_graphdef, pol_params, pol_frozen, tokenizer, prompts,
                             data_iter, scorer, tree=tree, turn_gamma=ppo.gamma)
    place_rollouts(cfg, ppo, rollouts, pol_params, pol_frozen, rollout_devices, log)
    log(f"rollout rows: {rollouts.describe()}")
    evaluate = rollouts.evaluator(held_out)

    def prepare(state, prompt_batch, step_index, later=None):  # the loop's hook: the rollout
        if later is not None:  # partial episodes go on with the next version's policy
            later = replace(later, fetch=lambda f=later.fetch: {
                "params": policy_part(f()["params"])})
        rows, total, _, metrics = rollouts.collect(
            {"params": policy_part(state["params"])}, prompt_batch, step_index, later=later)
        scores = np.asarray(total, np.float32)
        rows["scores"] = scores.reshape(groups, ppo.group_size) if tree else scores
        if reference is not None:
            if mode == "ema":  # the EMA as the last step left it, as the in-step reference reads
                reference.transfer_params(state["ema"])
            rows["ref_logp"] = reference(rows)
        return rows, metrics

    # What a lagged rollout reads of its policy version: the EMA too when a remote reference
    # follows it (hone.train.lagged).
    lag_keys = ("params", "ema") if mode == "ema" and reference is not None else ("params",)
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, aux=aux, data=data_iter,
        eval_fn=None if evaluate is None else (lambda params: evaluate(policy_part(params))),
        prepare=prepare, lag=lagged(ppo, prepare, data_iter, keys=lag_keys,
                                    partial=rollouts.partial),
        place_batch=layout.place_batch, tokens_per_batch=work_tokens,
        flops_per_token=model.config.flops_per_token(ppo.max_prompt_tokens
                                                     + completion_width(cfg)),
        extra_metrics=policy_means, eval_at_start=True)
    final = run_loop(spec, cfg, run_dir)
    trained = nnx.merge(graphdef, unflatten(params, final["params"]), frozen)
    return trained, final, evaluate
