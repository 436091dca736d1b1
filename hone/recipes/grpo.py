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

from hone.agents.collect import AgentRollouts, make_agent_eval
from hone.agents.factory import environment_factory
from hone.config import GRPOConfig
from hone.data.shared_prefix import work_tokens
from hone.losses.rl import cispo_loss, grpo_advantages, policy_loss, policy_loss_denominator
from hone.models.loading import load_tokenizer
from hone.parallel import logical_names
from hone.rl.collect import Rollouts, make_rl_eval
from hone.rl.policy_metrics import diagnostics, policy_means
from hone.rl.prompts import load_prompts
from hone.rl.remote_reference import RemoteReference, reference_split
from hone.rl.reward_specs import make_rewards
from hone.rl.rollout import completion_width, flat_samples, tree_layout
from hone.rl.step import chunked, make_rl_step
from hone.train.build import build_model, make_layout, open_run
from hone.train.loop import LoopSpec, run_loop
from hone.train.optimizer import rl_optimizer
from hone.train.reference import reference_mode, reference_model
from hone.train.scoring import branch_logprobs, head_logprobs
from hone.train.state import new_train_state, split_model, train_params, tree_bytes
from hone.train.step import merge


def completion_window(cfg) -> tuple[int, int]:
    """(start, width): the slots of a rollout row (`hone.rl.rollout.pack_rows`: prompts
    left-padded to P = max_prompt_tokens) whose logits predict completion tokens: P-1 .. P+M-2."""
    return getattr(cfg, cfg.SECTION).max_prompt_tokens - 1, completion_width(cfg)


def model_logp(model, mb, window: tuple[int, int] | None = None, entropy: bool = False):
    """Log-probabilities of the targets [B, L] and, with `entropy`, the policy's entropy at the
    scored slots (else None). With a `window` (start, width) the LM head runs on those slots
    only: the entropy is [B, width] and logp is 0 outside them (the prompt's slots, which no
    loss reads), so the prompt's [B, P, V] logits are never formed; the head runs over chunks
    of model.head_chunk positions (`hone.train.scoring.head_logprobs`)."""
    hidden = model.hidden(mb["tokens"], positions=mb["positions"],
                          attention_mask=mb["attention_mask"])               # [B, L, D]
    if window is None:
        return head_logprobs(model, hidden, mb["targets"], entropy)
    start, width = window
    rows, length = mb["tokens"].shape
    if length != start + 1 + width:
        raise ValueError(f"model_logp: rows of {length} tokens are not rollout rows of "
                         f"{start + 1} prompt + {width} completion slots")
    logp, ent = head_logprobs(model, hidden[:, start:start + width],
                              mb["targets"][:, start:start + width], entropy)
    return jnp.pad(logp, ((0, 0), (start, length - start - width))), ent


def tree_logp(model, mb, entropy: bool = False):
    """From tree rows (`hone.rl.rollout.pack_tree_rows`): log-probs [B, M] of every sample's
    tokens and, with `entropy`, the entropy [B, M] at their slots (else None); B = groups x G
    in the rows layout's order (sample j of group k is row k·G + j); the prompt is computed
    once per group (`branch_logprobs`)."""
    logp, ent = branch_logprobs(model, mb, entropy)
    groups, g, m = logp.shape
    return logp.reshape(groups * g, m), None if ent is None else ent.reshape(groups * g, m)


def make_grpo_loss(cfg: GRPOConfig):
    grpo = cfg.grpo
    window = completion_window(cfg)
    max_len = completion_width(cfg)

    def loss_fn(model, mb, normalizer, key, aux):
        if "branch_ids" in mb:  # tree rows: from here on, everything is [B, M]
            (logp, entropy), mb, win = tree_logp(model, mb, True), flat_samples(mb), None
        else:
            (logp, entropy), win = model_logp(model, mb, window, True), window
        old = mb["old_logp"] if "old_logp" in mb else jax.lax.stop_gradient(logp)
        weights = None
        if grpo.tis_cap is not None:
            weights = jnp.minimum(jnp.exp(old - mb["sampler_logp"]), grpo.tis_cap)
        if grpo.loss_type == "cispo":  # the config allows token ratios, no KL, no TIS
            cap = {} if grpo.clip_eps_high is None else {"clip_eps_high": grpo.clip_eps_high}
            loss, metrics = cispo_loss(logp, old, mb["advantages"], mb["loss_mask"],
                                       agg=grpo.loss_agg, denominator=normalizer, **cap)
            return loss, dict(metrics, **diagnostics(entropy, logp, mb, win))
        loss, metrics = policy_loss(
            logp, old, mb["advantages"], mb["loss_mask"], clip_eps=grpo.clip_eps,
            clip_eps_high=grpo.clip_eps_high, ref_logp=mb.get("ref_logp"), kl_beta=grpo.beta,
            kl_kind=grpo.kl_kind, agg=grpo.loss_agg, ratio=grpo.ratio,
            max_len=max_len, is_weights=weights, denominator=normalizer)
        return loss, dict(metrics, **diagnostics(entropy, logp, mb, win))

    return loss_fn


def make_scoring(cfg: GRPOConfig, graphdef, template, mode: str | None):
    """The in-jit scoring of a rollout, `score_rollout(state, frozen, batch, aux) -> (batch,
    metrics)` (`make_rl_step`'s `score`): old and reference log-probabilities, as needed; None
    when the loss needs neither."""
    grpo = cfg.grpo
    need_old = grpo.iterations > 1
    if not need_old and mode is None:
        return None
    precision = cfg.train.precision
    window = completion_window(cfg)

    def logp_of(model, mb):  # [B, L] rows, or [groups, G, M] for tree rows
        if "branch_ids" in mb:
            return branch_logprobs(model, mb)[0]
        return model_logp(model, mb, window)[0]

    def score_rollout(state, frozen, batch, aux):
        def score_chunk(mb):  # one micro-batch of rows
            model = merge(graphdef, template, state["params"], frozen, precision)
            out = {}
            if need_old:
                out["old_logp"] = logp_of(model, mb)
            if mode is not None:
                out["ref_logp"] = logp_of(reference_model(model, mode, aux), mb)
            return jax.lax.stop_gradient(out)

        return dict(batch, **chunked(score_chunk, batch, cfg.train.grad_accum)), {}

    return score_rollout


def run_grpo(cfg: GRPOConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state, evaluate(params) or None)."""
    grpo = cfg.grpo
    tokenizer = load_tokenizer(cfg.model.source)
    prompts, held_out = load_prompts(cfg, grpo, tokenizer, log)
    agent = cfg.agent.enabled
    # An agent's episodes are rewarded by their environment; its factory is checked here,
    # before the run directory is written.
    factory = environment_factory(cfg, log) if agent else None
    rewards = None if agent else make_rewards(cfg, grpo, prompts, log)
    ref_devices, policy_devices = reference_split(cfg)
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
        epochs=grpo.iterations, layout=layout,
        score=make_scoring(cfg, graphdef, params, None if reference else mode))

    groups = cfg.train.batch_size // grpo.group_size
    tree = not agent and tree_layout(cfg, shards=layout.shards)
    log(f"rollout rows: {'one per prompt, its samples sharing it' if tree else 'one per sample'}"
        + (f" (episodes of up to {cfg.agent.max_turns} turns)" if agent else ""))
    data_iter = prompts.iterator(groups, cfg.train.seed)
    if agent:
        rollouts = AgentRollouts(cfg, grpo, graphdef, params, frozen, tokenizer, prompts,
                                 factory)
        evaluate = make_agent_eval(rollouts, held_out)
    else:
        rollouts = Rollouts(cfg, grpo, graphdef, params, frozen, tokenizer, prompts, data_iter,
                            rewards, tree=tree)
        evaluate = make_rl_eval(rollouts, held_out)

    def prepare(state, prompt_batch, step_index):  # the loop's host-side hook: the rollout
        if agent:
            rows, total, _, metrics = rollouts.collect(state, prompt_batch, step_index)
            del rows["turn_index"]  # PPO's per-turn rewards read it; GRPO's loss does not
        else:
            rows, total, _, metrics = rollouts.collect(
                state, prompt_batch, step_index, extra_rounds=grpo.dynamic_sampling_rounds)
        adv, _ = grpo_advantages(jnp.asarray(total), grpo.group_size, scale=grpo.scale,
                                 leave_one_out=grpo.leave_one_out)
        adv = np.asarray(adv, np.float32)
        rows["advantages"] = adv.reshape(groups, grpo.group_size) if tree else adv
        if reference is not None:
            rows["ref_logp"] = reference(rows)
        return rows, metrics

    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, aux=aux, data=data_iter, eval_fn=evaluate,
        prepare=prepare, place_batch=layout.place_batch, tokens_per_batch=work_tokens,
        flops_per_token=model.config.flops_per_token(grpo.max_prompt_tokens
                                                     + completion_width(cfg)),
        extra_metrics=policy_means, eval_at_start=True)
    final = run_loop(spec, cfg, run_dir)
    trained = rollouts.policy(final["params"])
    return trained, final, evaluate
