"""`hone eval accuracy --config RL_CONFIG`: a model scored as an agent, one greedy episode per
record, with the environment, tools and limits of the config's `agent:` section.

Design choices:
- The episodes are played exactly as agentic RL plays its held-out evaluation
  (`hone.rl.episode_collect.AgentRollouts.play` at temperature 0, the config's turn and token limits,
  the environment from `hone.agents.factory.environment_factory`), so a number printed here is
  the number a run's `eval_accuracy` would log for the same weights and records.
- Accuracy is the final reply checked against the record's answer (`rewards.answer_column`, by
  `is_correct`, as the RL metric does); it is absent when records carry no answer, and the mean
  reward is then the score. The `agent/...` counters (turns, tool calls, cut turns, limits) are
  reported as the rollout counts them.
- Records are played `batch_size` at a time: the KV cache holds every episode of a call at its
  longest (opening + max_turns turns + environment turns), so the batch bounds memory. Greedy
  episodes do not depend on the seed; the environments' seeds do (`episode_seed` with the
  record's place in its batch), which matters only to environments that draw at random.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hone.errors import InputError


@dataclass
class AgentReport:
    accuracy: float | None  # final reply correct, over records with an answer; None: no answers
    reward: float  # mean episode reward (the sum of its turns' rewards)
    episodes: int  # records played, one greedy episode each
    metrics: dict[str, float] = field(default_factory=dict)  # agent/... means and counters
    replies: list[str] = field(default_factory=list)  # each episode's final reply
    correct: list[bool] = field(default_factory=list)  # per record, when answers are known

    def as_dict(self) -> dict:
        out = {"accuracy": self.accuracy, "reward_mean": self.reward, "episodes": self.episodes}
        return {**out, **self.metrics}


def agent_config(path: str):
    """The RL config (grpo or ppo, by its sections) at `path`; an InputError unless it has an
    enabled `agent:` section."""
    from hone.config import COMMANDS, load_config
    from hone.config.yaml_io import read_yaml
    sections = read_yaml(path)
    sections = sections if isinstance(sections, dict) else {}  # load_config says what is wrong
    command = next((c for c in ("grpo", "ppo") if c in sections), "grpo")
    cfg = load_config(COMMANDS[command], path, [])
    if not cfg.agent.enabled:
        raise InputError("the config has no agent (set agent.environment or agent.tools); "
                         "--config is for scoring a model as an agent", path=path, key="agent")
    return cfg


def scoring_rollouts(cfg, tokenizer, log=None):
    """`cfg`'s agent as an AgentRollouts that only plays and scores (no train state, prompts
    or graph)."""
    from hone.agents.factory import environment_factory
    from hone.rl.episode_collect import AgentRollouts
    factory = environment_factory(cfg, log or (lambda _: None))
    return AgentRollouts(cfg, getattr(cfg, cfg.SECTION), None, None, None, tokenizer, None,
                         factory)


def play_records(rollouts, model, records: list[dict], *, samples: int = 1,
                 temperature: float = 0.0, batch_size: int = 32, seed: int = 0,
                 log=None) -> list:
    """`samples` episodes of each record (a record's episodes together), `batch_size` records
    at a time."""
    episodes = []
    for start in range(0, len(records), batch_size):
        chunk = records[start:start + batch_size]
        episodes += rollouts.play(model, chunk, samples, seed, temperature=temperature)
        if log:
            log(f"{len(episodes)}/{len(records) * samples} episodes")
    return episodes


def agent_accuracy(model, tokenizer, cfg, records: list[dict], *, batch_size: int = 32,
                   seed: int = 0, log=None) -> AgentReport:
    """Play one greedy episode of each record with `cfg`'s agent section and score them."""
    from hone.rl.episode_collect import final_reply
    from hone.grading import is_correct
    if batch_size < 1:
        raise InputError(f"must be >= 1, got {batch_size}", key="--batch-size")
    rollouts = scoring_rollouts(cfg, tokenizer, log)
    episodes = play_records(rollouts, model, records, batch_size=batch_size, seed=seed, log=log)
    m = rollouts.metrics(episodes, records)
    column = cfg.rewards.answer_column
    replies = [final_reply(ep) for ep in episodes]
    correct = ([bool(is_correct(t, r[column])) for t, r in zip(replies, records)]
               if "accuracy" in m else [])
    counters = {k: v for k, v in m.items() if k.startswith("agent/")}
    counters.update(completion_len_mean=m["completion_len_mean"],
                    truncated_fraction=m["truncated_fraction"])
    return AgentReport(m.get("accuracy"), m["reward_mean"], len(episodes), counters, replies,
                       correct)
