"""The host side of an RL rollout, between steps and outside jit: the policy's current weights
-> sampled, scored, laid-out training rows; and the greedy held-out evaluation.

`Rollouts.collect(state, prompt_batch, step)` builds the policy from the state's current weights
(no copy), samples G completions per prompt (`hone.rl.rollout`), scores them with the reward
functions and lays them out as rows (one per sample) or tree rows (one per prompt group).
DAPO dynamic sampling draws further prompt batches from the same iterator (whose position is in
the checkpoint) until the batch holds enough groups whose rewards differ.
"""

from __future__ import annotations

import time

import numpy as np

from hone.grading import is_correct
from hone.rl.prompts import PromptData
from hone.rl.rollout import (PolicyView, Samples, completion_stats, equal_groups, pack_rows,
                             pack_tree_rows, refill_groups, sample, step_seed, tree_width)


class Rollouts(PolicyView):
    """Host side of a rollout: policy weights -> scored, laid-out training rows."""

    def __init__(self, cfg, section, graphdef, template, frozen, tokenizer, prompts, data_iter,
                 rewards, tree: bool = False):
        self.cfg, self.s, self.tree = cfg, section, tree  # tree: pack_tree_rows, one per group
        self.graphdef, self.template, self.frozen = graphdef, template, frozen
        self.tokenizer, self.prompts, self.data_iter = tokenizer, prompts, data_iter
        self.rewards = rewards
        self.groups = cfg.train.batch_size // section.group_size

    partial = False  # a completion is one turn: nothing goes on with newer weights

    def describe(self) -> str:
        return "one per prompt, its samples sharing it" if self.tree else "one per sample"

    def draw(self, model, indices, step: int, round_: int = 0) -> tuple[Samples, object]:
        """G samples of each prompt of `indices` and their rewards (the run's seed, step and
        refill round fix the draw)."""
        s = self.s
        ids, texts, columns = self.prompts.select(indices)
        samples = sample(model, self.tokenizer, ids, texts, columns, group_size=s.group_size,
                         max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                         top_k=s.top_k, top_p=s.top_p, prompt_bucket=s.max_prompt_tokens,
                         cache_dtype=None if s.cache_dtype == "auto" else s.cache_dtype,
                         seed=step_seed(self.cfg.train.seed, step, round_), engine=s.engine,
                         max_seqs=s.max_seqs)
        return samples, self.score(samples)

    def score(self, samples: Samples):
        return self.rewards(samples.prompt_texts, samples.texts, samples.columns,
                            samples.lengths)

    def collect(self, state, prompt_batch, step: int, later=None):
        """This step's rollout from a batch of the prompt iterator ({"index": [groups, 1]}, see
        `PromptData.iterator`): (rows, total, samples, metrics). `later` (the next policy
        version of partial episodes) is not used: a completion is one turn. With
        `dynamic_sampling_rounds` in the section (GRPO's DAPO), up to that many further batches
        are drawn while fewer groups than the batch holds have rewards that differ.

        rows: the training rows (`pack_rows` [B, L], or `pack_tree_rows` [groups, ...] when
        `tree`); total: each sample's summed reward [B], group-major; samples: the `Samples`
        the rows were laid out from (completions, texts, columns); metrics: host-side rollout
        metrics (reward means, events, completion lengths, refill rounds, rollout_s)."""
        t0 = time.perf_counter()
        model = self.policy(state["params"])
        g = self.s.group_size
        extra_rounds = getattr(self.s, "dynamic_sampling_rounds", 0)
        samples, result = self.draw(model, prompt_batch["index"][:, 0], step, 0)
        first_zero = equal_groups(result.total, g)
        parts, rounds = [(samples, result)], 0
        if extra_rounds:
            parts, chosen = refill_groups(
                parts[0], g, extra_rounds, lambda r: self.draw(
                    model, self.data_iter.next()["index"][:, 0], step, r),
                lambda part: part[1].total)
            rounds = len(parts) - 1
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
        if extra_rounds:  # the kept groups are chosen by reward: the first round's are not
            metrics["drawn_reward_mean"] = float(np.mean(parts[0][1].total))
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

    def evaluator(self, held_out: PromptData | None):
        """params -> {"eval_accuracy", "eval_reward", "eval_completion_len"} on the held-out
        prompts, answered greedily; None without held-out prompts."""
        if held_out is None:
            return None
        from hone.sampling.generate import generate

        def evaluate(params) -> dict:
            outs = generate(self.policy(params), self.tokenizer, held_out.ids,
                            max_new_tokens=self.s.max_new_tokens, temperature=0.0,
                            min_prompt_bucket=self.s.max_prompt_tokens)
            samples = Samples(held_out.ids, held_out.texts, outs, held_out.columns, 1)
            m = self.metrics(samples, self.score(samples))
            out = {"eval_reward": m["reward_mean"],
                   "eval_completion_len": m["completion_len_mean"]}
            if "accuracy" in m:
                out["eval_accuracy"] = m["accuracy"]
            return out

        return evaluate


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
