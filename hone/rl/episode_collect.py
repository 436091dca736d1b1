"""The host side of an agentic RL step: the policy's current weights -> episodes -> training rows,
and the greedy held-out evaluation of a model as an agent.

`AgentRollouts.collect(state, prompt_batch, step)` plays G episodes of each record of the batch
(`hone.agents.rollout`), sums each episode's rewards and lays the episodes out as rows
(`hone.agents.episode_rows.episode_rows`). The sampler's seed is `step_seed(run seed, step)` and each
environment's seed is derived from it, the record's place in the batch and the copy, so a
resumed run plays the episodes an uninterrupted run would have.

DAPO dynamic sampling (`grpo.dynamic_sampling_rounds`): while fewer of the step's groups than
the batch holds have rewards that differ, further records are drawn from the run's prompt
iterator (whose position is in the checkpoint) and played, each round with a seed of its own
(`step_seed(run seed, step, round)`); the groups whose rewards differ are kept first, in the
order they were played, and groups whose rewards are all equal fill what is left.

Partial episodes (agent.switch_turn, with a policy lag): `collect(..., later=NextVersion)` plays
the turns from switch_turn on with the next policy version (hone.agents.rollout.Switch); each
model token keeps the version that sampled it (`Episode.versions`) and its log-prob there, which
the rows' sampler_logp carries to the off-policy corrections; `sampled_version_mean` (over model
tokens) is what the step's `policy_lag` is reckoned from, `partial_fraction` the share of
episodes that span two versions.
"""

from __future__ import annotations

import time

import numpy as np

from hone.agents.episode_rows import episode_rows, turn_arrays
from hone.agents.episode import Episode, Switch, episode_metrics
from hone.agents.rollout import rollout
from hone.grading import is_correct
from hone.rl.rollout import PolicyView, equal_groups, refill_groups, step_seed


def final_reply(ep: Episode) -> str:
    """The model's last turn, as text."""
    return next((m.get("content") or "" for m in reversed(ep.messages)
                 if m.get("role") == "assistant"), "")


def zero_std_fraction(total: np.ndarray, group_size: int) -> float:
    """The share of groups whose rewards are all equal (`equal_groups`)."""
    return float(np.mean(equal_groups(total, group_size)))


class AgentRollouts(PolicyView):
    """Episodes with the policy's current weights, scored and laid out as rows."""

    def __init__(self, cfg, section, graphdef, template, frozen, tokenizer, prompts, factory,
                 turn_gamma: float | None = None, data_iter=None):
        self.cfg, self.s, self.a = cfg, section, cfg.agent
        self.graphdef, self.template, self.frozen = graphdef, template, frozen
        self.tokenizer, self.prompts, self.factory = tokenizer, prompts, factory
        self.turn_gamma = turn_gamma  # rows carry per-turn rewards and discounts (PPO)
        self.data_iter = data_iter  # the run's prompt iterator: dynamic sampling's refills

    @property
    def partial(self) -> bool:
        """Whether episodes go on with the next policy version (agent.switch_turn)."""
        return self.a.switch_turn is not None

    def describe(self) -> str:
        return f"one per episode (episodes of up to {self.a.max_turns} turns)"

    def play(self, model, records: list[dict], group_size: int, seed: int,
             temperature: float | None = None, version: int = 0,
             switch: Switch | None = None) -> list[Episode]:
        s, a = self.s, self.a
        temperature = s.temperature if temperature is None else temperature
        return rollout(model, self.tokenizer, self.factory, records, max_turns=a.max_turns,
                       max_new_tokens=s.max_new_tokens, max_episode_tokens=a.max_episode_tokens,
                       max_tool_tokens=a.max_tool_tokens, max_env_tokens=a.max_env_tokens,
                       temperature=temperature, top_k=None if temperature == 0 else s.top_k,
                       top_p=None if temperature == 0 else s.top_p, seed=seed,
                       group_size=group_size, prompt_bucket=s.max_prompt_tokens,
                       max_opening_tokens=s.max_prompt_tokens, env_timeout_s=a.env_timeout_s,
                       cache_dtype=None if s.cache_dtype == "auto" else s.cache_dtype,
                       max_after_opening=a.max_episode_tokens - s.max_prompt_tokens,
                       max_seqs=s.max_seqs, policy_version=version, switch=switch,
                       template_args=a.template_kwargs())

    def collect(self, state, prompt_batch, step: int, later=None):
        """(rows [B, L], total reward [B], episodes, host metrics) of this step's episodes.
        prompt_batch: {"index": [records, 1]} from `PromptData.iterator`. later: the next
        policy version (module doc), used when agent.switch_turn is set."""
        t0 = time.perf_counter()
        model = self.policy(state["params"])
        g = self.s.group_size
        switch, version = None, step
        if later is not None and self.a.switch_turn is not None:
            version = later.own
            switch = Switch(self.a.switch_turn,
                            lambda: self.policy(later.fetch()["params"]), later.version)

        def play_round(batch, round_: int) -> tuple[list[Episode], list[dict]]:
            records = [self.prompts.records[int(i)] for i in np.asarray(batch["index"][:, 0])]
            episodes = self.play(model, records, g, step_seed(self.cfg.train.seed, step, round_),
                                 version=version, switch=switch)
            return episodes, [r for r in records for _ in range(g)]

        episodes, per_episode = play_round(prompt_batch, 0)
        first = np.asarray([ep.reward for ep in episodes], np.float32)
        rounds = getattr(self.s, "dynamic_sampling_rounds", 0)
        refills = 0
        if rounds and g > 1:
            episodes, per_episode, refills = self.refill(episodes, per_episode, play_round,
                                                         rounds)
        rows = episode_rows(episodes, self.s.max_prompt_tokens, self.a.max_episode_tokens,
                            self.tokenizer.pad_id)
        if self.turn_gamma is not None:  # discounts per token, agent.gamma between turns
            rows["turn_rewards"], rows["turn_discount"] = turn_arrays(
                episodes, rows, self.turn_gamma, self.a.gamma)
        del rows["turn_index"]  # what turn_arrays reads; no loss does
        total = np.asarray([ep.reward for ep in episodes], np.float32)
        metrics = self.metrics(episodes, per_episode)
        if g > 1:  # of the first round's groups, as single-turn GRPO logs it (hone.rl.collect)
            metrics["zero_std_fraction"] = zero_std_fraction(first, g)
        if rounds and g > 1:  # the kept groups are chosen by reward: the first round is not
            metrics.update(refill_rounds=float(refills), drawn_reward_mean=float(first.mean()))
        if switch is not None:
            metrics.update(_version_metrics(episodes))
        metrics["rollout_s"] = time.perf_counter() - t0
        return rows, total, episodes, metrics

    def refill(self, episodes: list[Episode], per_episode: list[dict], play_round,
               rounds: int) -> tuple[list[Episode], list[dict], int]:
        """DAPO dynamic sampling over episodes (`hone.rl.rollout.refill_groups`), further
        batches from the prompt iterator: (the chosen groups' episodes, their records, the
        rounds played after the first)."""
        if self.data_iter is None:
            raise ValueError("dynamic sampling needs the run's prompt iterator")
        g = self.s.group_size
        parts, chosen = refill_groups(
            (episodes, per_episode), g, rounds,
            lambda r: play_round(self.data_iter.next(), r),
            lambda part: [ep.reward for ep in part[0]])
        span = lambda k: slice(k * g, (k + 1) * g)  # noqa: E731
        return ([ep for p, k in chosen for ep in parts[p][0][span(k)]],
                [r for p, k in chosen for r in parts[p][1][span(k)]], len(parts) - 1)

    def metrics(self, episodes: list[Episode], records: list[dict]) -> dict[str, float]:
        total = np.asarray([ep.reward for ep in episodes], np.float64)
        m = {"reward_mean": float(total.mean()), "reward_std": float(total.std())}
        column = self.cfg.rewards.answer_column
        if all(column in r for r in records):
            m["accuracy"] = float(np.mean([is_correct(final_reply(ep), r[column])
                                           for ep, r in zip(episodes, records)]))
        lengths = np.asarray([sum(ep.model_mask) for ep in episodes], np.float32)
        m.update(completion_len_mean=float(lengths.mean()),
                 completion_len_max=float(lengths.max()),
                 truncated_fraction=float(np.mean([ep.limit is not None for ep in episodes])))
        m.update(episode_metrics(episodes))
        return m


    def evaluator(self, held_out):
        """params -> {"eval_reward", "eval_accuracy", "eval_turns"} on the held-out records,
        played greedily (one episode each); None without held-out records."""
        if held_out is None:
            return None

        def evaluate(params) -> dict:
            episodes = self.play(self.policy(params), held_out.records, 1, 0, temperature=0.0)
            m = self.metrics(episodes, held_out.records)
            out = {"eval_reward": m["reward_mean"], "eval_turns": m["agent/turns_mean"]}
            if "accuracy" in m:
                out["eval_accuracy"] = m["accuracy"]
            return out

        return evaluate


def _version_metrics(episodes: list[Episode]) -> dict[str, float]:
    """The mean policy version over the episodes' model tokens and the share of episodes
    whose tokens come from two versions."""
    sampled = [v for ep in episodes for v in ep.versions if v >= 0]
    spans = [len({v for v in ep.versions if v >= 0}) > 1 for ep in episodes]
    return {"sampled_version_mean": float(np.mean(sampled)) if sampled else 0.0,
            "partial_fraction": float(np.mean(spans)) if spans else 0.0}
