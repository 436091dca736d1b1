"""`hone reward`: a reward model trained on preference pairs (Bradley-Terry).

The backbone (full or with LoRA adapters) gets a scalar head read at the last real token; the
loss is -log sigmoid(r_chosen - r_rejected - margin) plus optional reward centering. Evaluation
reports pairwise accuracy on held-out pairs. `hone export` writes the result as a Hugging Face
sequence-classification folder, which `hone.weights.hf_reward.load_reward_model` reads back for RL.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from hone.config import RewardConfig
from hone.data.preference import load_pairs
from hone.data.shared_prefix import work_tokens
from hone.losses.preference import pair_count, reward_loss
from hone.tokenizer import load_tokenizer
from hone.train.build import (build_reward_model, compile_steps, make_layout, open_run,
                              summed_eval)
from hone.train.loop import LoopSpec, run_loop
from hone.train.state import unflatten
from hone.train.step import pair_split


def make_reward_loss(cfg: RewardConfig):
    r = cfg.reward

    def loss_fn(model, mb, normalizer, key, aux):
        if "branch_ids" in mb:  # one [prompt | chosen | rejected] row per pair
            both = model.branch_rewards(mb["tokens"], mb["positions"], mb["attention_mask"],
                                        mb["segment_ids"], mb["branch_ids"])
            rewards = jnp.concatenate([both[:, 0], both[:, 1]])
        else:
            rewards = model(mb["tokens"], positions=mb["positions"],
                            attention_mask=mb["attention_mask"], segment_ids=mb["segment_ids"])
        b = rewards.shape[0] // 2
        valid = mb["pair_valid"]
        losses, parts = jax.vmap(lambda c, j: reward_loss(
            c, j, margin=r.margin, center_coef=r.center_coef))(rewards[:b], rewards[b:])
        metrics = {"pairs": jnp.sum(valid),
                   "accuracy_sum": jnp.sum((rewards[:b] > rewards[b:]) * valid),
                   "margin_sum": jnp.sum((rewards[:b] - rewards[b:]) * valid),
                   "reward_sum": jnp.sum((rewards[:b] + rewards[b:]) * valid) / 2}
        return jnp.sum(losses * valid) / normalizer, metrics

    return loss_fn


def means(row: dict, prefix: str = "") -> dict:
    pairs = max(float(row.get(prefix + "pairs", 0.0)), 1.0)
    return {prefix + name: row[prefix + name + "_sum"] / pairs
            for name in ("accuracy", "margin", "reward") if prefix + name + "_sum" in row}


def run_reward(cfg: RewardConfig, *, log=print):
    """Train per cfg; returns (trained RewardModel, final train state)."""
    tokenizer = load_tokenizer(cfg.model.source)
    train_data, eval_data = load_pairs(cfg, tokenizer, log,
                                       shared_prompt=cfg.reward.shared_prompt)
    layout = make_layout(cfg, rows_per_example=2)
    model, trainable = build_reward_model(cfg, layout)
    run_dir = open_run(cfg)
    graphdef, params, frozen, state, step, eval_step = compile_steps(
        cfg, model, trainable, make_reward_loss(cfg), pair_count,
        split=pair_split, layout=layout)
    eval_fn = None
    if eval_data is not None:
        eval_fn = summed_eval(eval_step, frozen, eval_data, place=layout.place_batch,
                              means=lambda t: means(t, "eval_"),
                              max_batches=cfg.train.eval_batches)
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, data=train_data.iterator(),
        eval_fn=eval_fn, place_batch=layout.place_batch,
        tokens_per_batch=work_tokens,
        flops_per_token=model.config.flops_per_token(cfg.data.max_length), extra_metrics=means)
    final = run_loop(spec, cfg, run_dir)
    return nnx.merge(graphdef, unflatten(params, final["params"]), frozen), final
