"""`hone dpo` with `dpo.online: true`: online DPO (Guo et al. 2024), preference learning from the
policy's own samples ranked by a judge instead of a fixed set of pairs.

Each step:
1. draw train.batch_size prompts (`hone.rl.prompts`: the iterator's position is in the
   checkpoint);
2. sample dpo.group_size completions of each from the current weights, one prefill per prompt
   shared by its samples (`hone.rl.rollout.sample`; the seed is a function of the run seed and
   the step, so a resumed run draws exactly what an uninterrupted one would);
3. score them with the judge, the `rewards:` section as `hone grpo` reads it (reward functions
   and/or a reward model exported by `hone reward`), and pair each prompt's best sample (chosen)
   with its worst (rejected) (`hone.rl.judge_pairs`); a prompt whose samples tie is skipped and
   counted;
4. lay each prompt and its pair out as one shared-prefix row [prompt | chosen | rejected]
   (`hone.rl.rollout.pack_tree_rows`) and run one update of `hone.losses.dpo_loss` (sigmoid,
   IPO, hinge, robust) against the reference (a frozen copy, or the base with adapters off:
   `hone.train.reference`).

Design choices:
- Per-pair losses are summed over the usable pairs of each micro-batch and divided by the usable
  pairs of the whole batch (`pair_count`), so train.grad_accum never changes the update.
- A batch with no usable pair withholds its update inside the jitted step: the weights, the
  optimizer state and the guard state stay as they were (an Adam step on zero gradients would
  still move the weights), the step counter moves on, and the row logs update_skipped = 1.
- The sampler-versus-trainer log-probability gap comes free from the update's forward pass:
  both sides are the model's own distribution (`hone.rl.rollout`), so it measures numerics.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from hone.config import DPOConfig
from hone.data.shared_prefix import work_tokens
from hone.errors import InputError
from hone.losses.preference import dpo_loss, pair_count, sequence_logprobs
from hone.rl.collect import Rollouts
from hone.rl.judge_pairs import pair_samples, pick_pairs
from hone.rl.prompts import load_prompts
from hone.rl.reward_specs import make_rewards
from hone.rl.rollout import pack_tree_rows, tree_width
from hone.tokenizer import load_tokenizer
from hone.train.build import build_model, compile_steps, make_layout, open_run
from hone.train.lagged import lagged
from hone.train.loop import LoopSpec, run_loop
from hone.train.reference import reference_mode, reference_model
from hone.train.scoring import branch_logprobs
from hone.train.state import tree_bytes
from hone.train.step import update_fn, withhold

_PAIR_SUMS = ("rewards_chosen", "rewards_rejected", "margin", "accuracy")


def make_online_loss(cfg: DPOConfig, mode: str):
    """`loss_fn(model, mb, normalizer, key, aux)` over rows [prompt | chosen | rejected]:
    mb["loss_mask"] and mb["sampler_logp"] [n, 2, M] (answer 0 chosen, 1 rejected),
    mb["pair_valid"] [n] (1 = a usable pair)."""
    d = cfg.dpo

    def loss_fn(model, mb, normalizer, key, aux):
        mask, valid = mb["loss_mask"], mb["pair_valid"]                      # [n, 2, M], [n]
        logp = branch_logprobs(model, mb)[0]                                 # [n, 2, M]
        ref_logp = jax.lax.stop_gradient(
            branch_logprobs(reference_model(model, mode, aux), mb)[0])       # [n, 2, M]
        seq, ref = sequence_logprobs(logp, mask), sequence_logprobs(ref_logp, mask)  # [n, 2]
        lens = jnp.sum(mask, axis=-1)                                        # [n, 2]
        # Data-distribution estimate of KL(policy || reference) per completion token.
        metrics = {"pairs": jnp.sum(valid),
                   "kl_sum": jnp.sum(jnp.sum(jax.lax.stop_gradient(seq) - ref, -1) * valid),
                   "completion_tokens": jnp.sum(jnp.sum(lens, -1) * valid)}
        if d.loss_type == "ipo":  # IPO compares length-averaged log-probs (as hone dpo does)
            seq, ref = seq / jnp.maximum(lens, 1.0), ref / jnp.maximum(lens, 1.0)
        losses, parts = jax.vmap(lambda pc, pr, rc, rr: dpo_loss(
            pc, pr, rc, rr, beta=d.beta, loss_type=d.loss_type,
            label_smoothing=d.label_smoothing))(seq[:, 0], seq[:, 1], ref[:, 0], ref[:, 1])
        for name in _PAIR_SUMS:
            metrics[name + "_sum"] = jnp.sum(parts[name] * valid)
        gap = (jax.lax.stop_gradient(logp) - mb["sampler_logp"]) * mask     # [n, 2, M]
        metrics.update(tokens=jnp.sum(mask), sampler_gap_sum=jnp.sum(jnp.abs(gap)),
                       sampler_gap_sq_sum=jnp.sum(gap * gap))
        return jnp.sum(losses * valid) / normalizer, metrics

    return loss_fn


def make_online_step(cfg: DPOConfig, graphdef, template, loss_fn, optimizer, schedule,
                     accum: int, layout):
    """The jitted `step(state, frozen, batch, aux) -> (state, metrics)`: one update, withheld
    when the batch holds no usable pair (module docstring)."""
    update = update_fn(graphdef, template, loss_fn, pair_count, optimizer, schedule,
                       accum=accum, precision=cfg.train.precision, layout=layout)

    def step(state, frozen, batch, aux=None):
        new, metrics = update(state, frozen, batch, aux)
        usable = jnp.sum(batch["pair_valid"]) > 0
        return withhold(usable, new, state), dict(
            metrics, update_skipped=1.0 - usable.astype(jnp.float32))

    return jax.jit(step, donate_argnums=(0,))


def means(row: dict) -> dict:
    """Per-pair means of the summed pair metrics of a logged row, the per-token KL, and the
    sampler-versus-trainer gap per completion token (mean absolute and RMS)."""
    out = {}
    pairs = max(float(row.get("pairs", 0.0)), 1.0)
    for name in _PAIR_SUMS:
        if name + "_sum" in row:
            out[name] = row[name + "_sum"] / pairs
    if "kl_sum" in row:
        out["kl"] = row["kl_sum"] / max(float(row["completion_tokens"]), 1.0)
    if "sampler_gap_sum" in row:
        tokens = max(float(row["tokens"]), 1.0)
        out["sampler_gap"] = row["sampler_gap_sum"] / tokens
        out["sampler_gap_rms"] = float(np.sqrt(row["sampler_gap_sq_sum"] / tokens))
    return out


def make_judge(cfg: DPOConfig, prompts, log):
    """The judge (`hone.rl.reward_specs.make_rewards`), checked against the prompts' columns;
    a preference-pair file given as prompts is named as such."""
    try:
        return make_rewards(cfg, cfg.dpo, prompts, log)
    except InputError as e:
        if not {"chosen", "rejected"} <= set(prompts.columns):
            raise
        raise InputError(
            f"{cfg.data.path} holds preference pairs (prompt, chosen, rejected), and the judge "
            f"cannot score them ({e}). Online DPO samples its own pairs from prompts: point "
            f"data.path at prompts with the columns the judge reads (builtin:arithmetic-rl "
            f"has `answer`), or judge with rewards.reward_model or rewards.functions",
            key="data.path") from None


def run_online_dpo(cfg: DPOConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state, evaluate(params) or None)."""
    d = cfg.dpo
    tokenizer = load_tokenizer(cfg.model.source)
    prompts, held_out = load_prompts(cfg, d, tokenizer, log)
    judge = make_judge(cfg, prompts, log)
    layout = make_layout(cfg, rows_per_example=2)
    model, trainable = build_model(cfg, layout=layout)
    run_dir = open_run(cfg)

    mode = reference_mode(cfg)
    loss_fn = make_online_loss(cfg, mode)
    graphdef, params, frozen, state, step, _ = compile_steps(
        cfg, model, trainable, loss_fn, pair_count, layout=layout,
        make_step=lambda graphdef, params, optimizer, schedule, accum: make_online_step(
            cfg, graphdef, params, loss_fn, optimizer, schedule, accum, layout))
    # The starting weights, never updated: a real copy (the train state's buffers are donated).
    aux = jax.tree.map(jnp.copy, state["params"]) if mode == "copy" else None
    log(f"reference: {mode} ({tree_bytes(aux) / 2**20:.1f} MiB of extra weights)")
    log(f"online pairs: {cfg.train.batch_size} prompts x {d.group_size} samples per step, the "
        f"judge's best against its worst")

    data_iter = prompts.iterator(cfg.train.batch_size, cfg.train.seed)
    # Rollouts lends its policy view, draw and judge call, rollout metrics and evaluation.
    rollouts = Rollouts(cfg, d, graphdef, params, frozen, tokenizer, prompts, data_iter, judge)
    evaluate = rollouts.evaluator(held_out)

    def prepare(state, prompt_batch, step_index):  # the loop's host-side hook
        t0 = time.perf_counter()
        samples, result = rollouts.draw(rollouts.policy(state["params"]),
                                        prompt_batch["index"][:, 0], step_index)
        pairs = pick_pairs(result.total, d.group_size)
        paired = pair_samples(samples, pairs)
        rows = pack_tree_rows(paired, d.max_prompt_tokens,
                              tree_width(paired, d.max_new_tokens), tokenizer.pad_id)
        rows["pair_valid"] = pairs.usable.astype(np.float32)  # [N]
        if not pairs.usable.any():
            log(f"step {step_index + 1}: every prompt's samples scored the same under the "
                f"judge; no pair to learn from, so this step leaves the weights as they are")
        metrics = dict(rollouts.metrics(samples, result), **pairs.metrics())
        if "accuracy" in metrics:  # "accuracy" is the pairs' (as hone dpo logs it)
            metrics["sample_accuracy"] = metrics.pop("accuracy")
        metrics["rollout_s"] = time.perf_counter() - t0
        return rows, metrics

    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, aux=aux, data=data_iter, eval_fn=evaluate,
        prepare=prepare, lag=lagged(d, prepare, data_iter),
        place_batch=layout.place_batch, tokens_per_batch=work_tokens,
        flops_per_token=model.config.flops_per_token(d.max_prompt_tokens + d.max_new_tokens),
        extra_metrics=means, eval_at_start=True)
    final = run_loop(spec, cfg, run_dir)
    return rollouts.policy(final["params"]), final, evaluate
