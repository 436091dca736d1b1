"""What `hone grpo` and `hone ppo` share: prompt data, reward functions from the config, the
host side of a rollout (sample, score, refill), held-out evaluation and the metric means.

The rollout runs between steps, outside jit: `Rollouts.collect(state, prompt_batch, step)`
builds the policy from the state's current weights (no copy), samples G completions per prompt,
scores them with the reward functions and returns the training rows plus rollout metrics.
DAPO dynamic sampling draws further prompt batches from the same iterator (whose position is in
the checkpoint) until the batch holds enough groups whose rewards differ.

With `<section>.reference_devices: N` the reference model is a `RemoteReference`: its weights on
the last N devices, the policy's mesh over the others, and each rollout's reference
log-probabilities computed there between the rollout and the step, so they reach the step with
the batch (`batch["ref_logp"]`) and its `prepare` runs no reference forward.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.datasets.arithmetic import is_correct
from hone.errors import InputError
from hone.losses import token_logprobs
from hone.parallel.roles import FrozenRole, split_devices
from hone.recipes.common import branch_logprobs
from hone.rl.prompts import PromptData
from hone.rl.rollout import (Samples, completion_stats, pack_rows, pack_tree_rows, sample,
                             step_seed, tree_width)
from hone.rl.step import chunked
from hone.train.state import flatten, unflatten
from hone.train.step import merge


def make_rewards(cfg, section, prompts: PromptData, log):
    """The config's reward functions, checked against the columns the prompts carry."""
    from hone.rl.rewards import build_rewards
    specs = reward_specs(cfg.rewards, section.max_new_tokens)
    if not specs:
        raise InputError("every reward weight is 0: there is nothing to learn from",
                         key="rewards")
    rewards = build_rewards(specs, timeout_s=cfg.rewards.timeout_s,
                            fallback=cfg.rewards.fallback, log=log)
    rewards.check_columns(list(prompts.columns))
    return rewards


def rl_optimizer(train, updates_per_step: int):
    """The optimizer with its schedule counted in updates (several per RL step)."""
    from dataclasses import replace

    from hone.train.optimizer import build_optimizer
    return build_optimizer(replace(train, max_steps=train.max_steps * updates_per_step,
                                   warmup_steps=train.warmup_steps * updates_per_step))


def load_prompts(cfg, section, tokenizer, log):
    """(training prompts, held-out prompts or None)."""
    d = cfg.data
    kw = dict(max_prompt_tokens=section.max_prompt_tokens, chat=section.chat,
              overlong=d.overlong)
    train = PromptData(d.path, tokenizer, max_records=d.max_records, **kw)
    log(f"data: {train.describe()}")
    held_out = None
    if d.eval_path:
        held_out = PromptData(d.eval_path, tokenizer, max_records=section.eval_prompts, **kw)
        log(f"eval data: {held_out.describe()}")
    return train, held_out


def reward_specs(section, max_new_tokens: int) -> list[dict]:
    """The weighted reward-function specs (`hone.rl.rewards.build_rewards`) of a `rewards:`
    section."""
    r = section
    specs: list[dict] = []
    if r.answer_match:
        specs.append({"name": "answer_match", "weight": r.answer_match,
                      "column": r.answer_column})
    if r.format:
        specs.append({"name": "format", "weight": r.format, "pattern": r.format_pattern})
    if r.length:
        specs.append({"name": "length", "weight": r.length, "target_tokens": r.length_target,
                      "per_token": -0.01})
    if r.overlong:
        specs.append({"name": "overlong", "weight": r.overlong, "max_tokens": max_new_tokens,
                      "cache_tokens": r.overlong_cache})
    if r.reward_model:
        specs.append({"name": "reward_model", "weight": r.reward_model_weight,
                      "path": r.reward_model})
    weights = r.function_weights or (1.0,) * len(r.functions)
    for fn, w in zip(r.functions, weights):
        specs.append({"name": fn, "weight": w})
    return specs


class Rollouts:
    """Host side of a rollout: policy weights -> scored, laid-out training rows."""

    def __init__(self, cfg, section, graphdef, template, frozen, tokenizer, prompts, data_iter,
                 rewards, tree: bool = False):
        self.cfg, self.s, self.tree = cfg, section, tree  # tree: pack_tree_rows, one per group
        self.graphdef, self.template, self.frozen = graphdef, template, frozen
        self.tokenizer, self.prompts, self.data_iter = tokenizer, prompts, data_iter
        self.rewards = rewards
        self.groups = cfg.train.batch_size // section.group_size

    def policy(self, params):
        """The policy module over the given weights (shared buffers, no copy)."""
        return nnx.merge(self.graphdef, unflatten(self.template, params), self.frozen)

    def _draw(self, model, indices, step: int, round_: int) -> tuple[Samples, object]:
        s = self.s
        ids, texts, columns = self.prompts.select(indices)
        samples = sample(model, self.tokenizer, ids, texts, columns, group_size=s.group_size,
                         max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                         top_k=s.top_k, top_p=s.top_p, prompt_bucket=s.max_prompt_tokens,
                         cache_dtype=None if s.cache_dtype == "auto" else s.cache_dtype,
                         seed=step_seed(self.cfg.train.seed, step, round_))
        return samples, self.score(samples)

    def score(self, samples: Samples):
        return self.rewards(samples.prompt_texts, samples.texts, samples.columns,
                            samples.lengths)

    def collect(self, state, prompt_batch, step: int, extra_rounds: int = 0):
        """(rows, per-sequence rewards [B], metrics) for this step's rollout."""
        t0 = time.perf_counter()
        model = self.policy(state["params"])
        g, need = self.s.group_size, self.groups
        samples, result = self._draw(model, prompt_batch["tokens"][:, 0], step, 0)
        first_zero = _zero_std_groups(result.total, g)
        parts, kept, spare, rounds = [(samples, result)], [], [], 0
        if extra_rounds:
            while True:
                zero = _zero_std_groups(parts[-1][1].total, g)
                kept += [(len(parts) - 1, k) for k in range(len(zero)) if not zero[k]]
                spare += [(len(parts) - 1, k) for k in range(len(zero)) if zero[k]]
                if len(kept) >= need or rounds >= extra_rounds:
                    break
                rounds += 1
                parts.append(self._draw(model, self.data_iter.next()["tokens"][:, 0], step,
                                        rounds))
            chosen = (kept + spare)[:need]
            samples = Samples.concat([parts[p][0].take_groups([k]) for p, k in chosen])
            events: dict[str, int] = {}
            for _, part in parts:  # every round's reward-function events, refills included
                for name, count in part.events.items():
                    events[name] = events.get(name, 0) + count
            result = _concat_results([_take(parts[p][1], k, g) for p, k in chosen], events)
        if self.tree:  # samples' slots only as wide as this rollout's completions need
            rows = pack_tree_rows(samples, self.s.max_prompt_tokens,
                                  tree_width(samples, self.s.max_new_tokens),
                                  self.tokenizer.pad_id)
        else:
            rows = pack_rows(samples, self.s.max_prompt_tokens, self.s.max_new_tokens,
                             self.tokenizer.pad_id)
        metrics = self.metrics(samples, result)
        if g > 1:
            metrics.update(zero_std_fraction=float(np.mean(first_zero)),
                           refill_rounds=float(rounds))
        metrics["rollout_s"] = time.perf_counter() - t0
        return rows, result.total, samples, metrics

    def metrics(self, samples: Samples, result) -> dict[str, float]:
        m = {"reward_mean": float(np.mean(result.total)),
             "reward_std": float(np.std(result.total))}
        for name, values in result.per_function.items():
            m[f"reward/{name}"] = float(np.mean(values))
        for name, count in result.events.items():
            m[f"events/{name}"] = float(count)
        answers = samples.columns.get(self.cfg.rewards.answer_column)
        if answers is not None:
            m["accuracy"] = float(np.mean([is_correct(t, a)
                                           for t, a in zip(samples.texts, answers)]))
        m.update(completion_stats(samples, self.s.max_new_tokens))
        return m


def _zero_std_groups(total, g: int) -> np.ndarray:
    groups = np.asarray(total, np.float64).reshape(-1, g)
    return np.all(groups == groups[:, :1], axis=1)


def _take(result, k: int, g: int):
    from hone.rl.rewards import RewardResult
    sl = slice(k * g, (k + 1) * g)
    return RewardResult(total=np.asarray(result.total)[sl],
                        per_function={n: np.asarray(v)[sl] for n, v in
                                      result.per_function.items()},
                        events={})


def _concat_results(results, events: dict[str, int]):
    from hone.rl.rewards import RewardResult
    return RewardResult(total=np.concatenate([r.total for r in results]),
                        per_function={n: np.concatenate([r.per_function[n] for r in results])
                                      for n in results[0].per_function},
                        events=events)


def make_rl_eval(rollouts: Rollouts, held_out: PromptData | None):
    """params -> {"eval_accuracy", "eval_reward", "eval_completion_len"} on the held-out prompts,
    answered greedily."""
    if held_out is None:
        return None
    from hone.sampling.generate import generate

    def evaluate(params) -> dict:
        model = rollouts.policy(params)
        outs = generate(model, rollouts.tokenizer, held_out.ids,
                        max_new_tokens=rollouts.s.max_new_tokens, temperature=0.0,
                        min_prompt_bucket=rollouts.s.max_prompt_tokens)
        samples = Samples(held_out.ids, held_out.texts, outs, held_out.columns, 1)
        result = rollouts.score(samples)
        m = rollouts.metrics(samples, result)
        out = {"eval_reward": m["reward_mean"], "eval_completion_len": m["completion_len_mean"]}
        if "accuracy" in m:
            out["eval_accuracy"] = m["accuracy"]
        return out

    return evaluate


def policy_means(row: dict) -> dict:
    """Per-token means of the summed policy-loss metrics of a logged row."""
    tokens = max(float(row.get("tokens", 0.0)), 1.0)
    out = {}
    for name, key in (("clip_fraction", "clipped_sum"), ("clip_low_fraction", "clipped_low_sum"),
                      ("clip_high_fraction", "clipped_high_sum"), ("ratio_mean", "ratio_sum"),
                      ("kl", "kl_sum"), ("entropy", "entropy_sum"),
                      ("sampler_gap", "sampler_gap_sum"),
                      ("value_clip_fraction", "value_clipped_sum")):
        if key in row:
            out[name] = row[key] / tokens
    if "sampler_gap_sq_sum" in row:
        out["sampler_gap_rms"] = float(np.sqrt(row["sampler_gap_sq_sum"] / tokens))
    return out


def reference_split(cfg) -> tuple[list | None, list | None]:
    """(the reference's devices, the policy's) for `<section>.reference_devices` > 0, else
    (None, None): every device is the policy's."""
    count = getattr(cfg, cfg.SECTION).reference_devices
    if not count:
        return None, None
    return split_devices(count, f"{cfg.SECTION}.reference_devices", "the policy")


class RemoteReference(FrozenRole):
    """The reference model on devices of its own: rollout rows -> ref_logp [B, L] (host), or
    from tree rows (`pack_tree_rows`) the samples' log-probabilities [groups, G, M].

    Its weights are the policy's frozen rest plus `params`, the reference's values of the
    policy's trainable weights (flat, keyed like `template`): the starting weights ("copy"),
    the EMA ("ema", sent again each step with `transfer_params`), or, for "adapters_off",
    ignored: the adapters are zeroed, so the reference is the frozen base. Its program builds
    the model exactly as the in-step reference does (`merge` in the training precision, then the
    trainable weights replaced, uncast, or zeroed), in chunks of one micro-batch, so the
    log-probabilities and the memory match the reference inside the step.
    """

    KEYS = ("tokens", "positions", "attention_mask", "targets")  # what its forward reads
    TREE_KEYS = ("tokens", "positions", "attention_mask", "segment_ids", "branch_ids",
                 "score_index", "score_targets")  # ... from tree rows

    def __init__(self, cfg, graphdef, template, frozen, trainable, mode: str, params: dict,
                 devices):
        if mode == "adapters_off":  # no transfer of adapter values the program zeroes anyway
            params = jax.tree.map(jnp.zeros_like, params)
        self.template = template
        precision, chunks = cfg.train.precision, cfg.train.grad_accum

        def ref_logp(weights, batch):
            flat = flatten(weights["params"])

            def score(mb):
                model = merge(graphdef, template, flat, weights["frozen"], precision)
                g, p, rest = nnx.split(model, trainable, ...)
                p = (jax.tree.map(jnp.zeros_like, p) if mode == "adapters_off"
                     else unflatten(p, flat))
                ref = nnx.merge(g, p, rest)
                if "branch_ids" in mb:
                    return branch_logprobs(ref, mb)[1]  # [groups, G, M]
                logits = ref(mb["tokens"], positions=mb["positions"],
                             attention_mask=mb["attention_mask"])
                return token_logprobs(logits, mb["targets"])  # [b, L]

            return chunked(score, batch, chunks)

        weights = {"params": unflatten(template, params), "frozen": frozen}
        super().__init__(weights, {"ref_logp": ref_logp}, devices)

    def transfer_params(self, params: dict) -> None:
        """New reference values of the trainable weights (flat), device to device."""
        self.transfer("params", unflatten(self.template, params))

    def __call__(self, rows: dict) -> np.ndarray:
        keys = self.TREE_KEYS if "branch_ids" in rows else self.KEYS
        return super().__call__({key: rows[key] for key in keys})

    def describe(self) -> str:
        per_device = self.layout.device_bytes(self.weights, self.devices[-1])
        return (f"on devices {[d.id for d in self.devices]} "
                f"({per_device / 2**20:.1f} MiB of weights on each)")
