"""`hone grpo`: GRPO and its variants (Dr.GRPO, DAPO, GSPO, RLOO) wired from a config.

Each step: draw prompts, sample G completions each with the current weights, score them with the
reward functions, turn rewards into group advantages, then one jitted program computes what the
loss needs from the rollout (old log-probabilities when the rollout is reused for several
iterations, the reference's log-probabilities when beta > 0) and runs the updates.

Design choices:
- beta = 0 builds no reference at all: no copy of weights, no reference forward pass.
- `grpo.reference_devices: N` puts the reference on the last N devices (`RemoteReference`): its
  log-probabilities are computed there between the rollout and the step and arrive with the
  batch, so the step's in-jit scoring (`make_scoring`) skips the reference and the policy's
  devices hold no copy.
- With one iteration the old log-probabilities are the trainer's own, detached (ratio 1, as TRL
  does), so no extra forward pass is spent; with more, they are computed once before the updates.
- The loss is summed per micro-batch and divided by the whole batch's denominator (tokens,
  sequences or B * max_new_tokens, per `grpo.loss_agg`), so the micro-batch split never changes
  the update.
- The sampler-versus-trainer log-probability gap is measured every step on the trainer's forward
  pass of the first update (mean absolute and RMS over completion tokens); `grpo.tis_cap` turns
  on the truncated importance-sampling correction it calls for.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hone.config import GRPOConfig
from hone.data.shared_prefix import work_tokens
from hone.losses.rl import grpo_advantages, policy_loss_denominator
from hone.parallel import logical_names
from hone.rl.grpo_objective import make_grpo_loss, make_scoring
from hone.rl.policy_metrics import policy_means
from hone.rl.prompts import load_prompts
from hone.rl.remote_reference import RemoteReference, reference_split
from hone.rl.rollout import completion_width, tree_layout
from hone.rl.rollout_devices import place_rollouts, rollout_split
from hone.rl.rollouts import make_rollouts, rollout_scorer
from hone.rl.step import make_rl_step
from hone.tokenizer import load_tokenizer
from hone.train.build import build_model, make_layout, open_run
from hone.train.lagged import lagged
from hone.train.loop import LoopSpec, run_loop
from hone.train.optimizer import rl_optimizer
from hone.train.reference import reference_mode
from hone.train.state import new_train_state, split_model, train_params, tree_bytes












def run_grpo(cfg: GRPOConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state, evaluate(params) or None)."""
    grpo = cfg.grpo
    tokenizer = load_tokenizer(cfg.model.source)
    prompts, held_out = load_prompts(cfg, grpo, tokenizer, log)
    scorer = rollout_scorer(cfg, grpo, prompts, log)  # checked before the run is written
    ref_devices, policy_devices = reference_split(cfg)
    rollout_devices, policy_devices = rollout_split(cfg, grpo, policy_devices)
    layout = make_layout(cfg, devices=policy_devices)
    model, trainable = build_model(cfg, layout=layout)
    run_dir = open_run(cfg)

    mode = reference_mode(cfg)
    layout.place_model(model)
    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = rl_optimizer(cfg.train, grpo.iterations)
    state = layout.place_train_state(new_train_state(train_params(model, params), optimizer, cfg.train.seed),
                                     logical_names(params))
    reference = None
    if ref_devices:  # the starting weights move to the reference's devices once
        reference = RemoteReference(cfg, graphdef, params, frozen, mode, state["params"],
                                    ref_devices)
        aux = None
        log(f"reference: {mode} {reference.describe()}")
    else:
        aux = jax.tree.map(jnp.copy, state["params"]) if mode == "copy" else None
        log(f"reference: {mode or 'none (beta = 0)'} ({tree_bytes(aux) / 2**20:.1f} MiB of "
            "extra weights)")
    step = make_rl_step(
        graphdef, params, make_grpo_loss(cfg),
        lambda b: policy_loss_denominator(b["loss_mask"], grpo.loss_agg,
                                          max_len=completion_width(cfg)),
        optimizer, schedule, accum=cfg.train.grad_accum, precision=cfg.train.precision,
        epochs=grpo.iterations, layout=layout, skip_zero=grpo.skip_zero_updates,
        score=make_scoring(cfg, graphdef, params, None if reference else mode))

    groups = cfg.train.batch_size // grpo.group_size
    tree = tree_layout(cfg, shards=layout.shards)
    data_iter = prompts.iterator(groups, cfg.train.seed)
    rollouts = make_rollouts(cfg, grpo, graphdef, params, frozen, tokenizer, prompts, data_iter,
                             scorer, tree=tree)
    place_rollouts(cfg, grpo, rollouts, params, frozen, rollout_devices, log)
    log(f"rollout rows: {rollouts.describe()}")
    evaluate = rollouts.evaluator(held_out)

    def prepare(state, prompt_batch, step_index, later=None):  # the loop's hook: the rollout
        rows, total, _, metrics = rollouts.collect(state, prompt_batch, step_index, later=later)
        adv, _ = grpo_advantages(jnp.asarray(total), grpo.group_size, scale=grpo.scale,
                                 leave_one_out=grpo.leave_one_out)
        adv = np.asarray(adv, np.float32)
        rows["advantages"] = adv.reshape(groups, grpo.group_size) if tree else adv
        if reference is not None:
            rows["ref_logp"] = reference(rows)
        return rows, metrics

    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, aux=aux, data=data_iter, eval_fn=evaluate,
        prepare=prepare,
        lag=lagged(grpo, prepare, data_iter, partial=rollouts.partial),
        place_batch=layout.place_batch, tokens_per_batch=work_tokens,
        flops_per_token=model.config.flops_per_token(grpo.max_prompt_tokens
                                                     + completion_width(cfg)),
        extra_metrics=policy_means, eval_at_start=True)
    final = run_loop(spec, cfg, run_dir)
    trained = rollouts.policy(final["params"])
    return trained, final, evaluate
