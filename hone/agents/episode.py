"""One agent episode as the rollout records it (`Episode`), the seed of the environment that plays
it (`episode_seed`), new weights from a turn on (`Switch`, asynchronous RL's partial episodes),
and the per-step means over a batch of episodes (`episode_metrics`). The rollout that fills
them is hone/agents/rollout.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence


@dataclass
class Episode:
    """One episode (API.md, section Agents). tokens/model_mask/logprobs are aligned."""

    tokens: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    reward: float = 0.0  # the sum of the steps' rewards
    turns: int = 0  # model turns taken
    messages: list[dict] = field(default_factory=list)
    done: bool = False  # the environment ended it (False: a limit or an error did)
    prompt_len: int = 0  # tokens of the opening
    rewards: list[float] = field(default_factory=list)  # per model turn
    turn_ends: list[int] = field(default_factory=list)  # index of each model turn's last token
    events: dict[str, int] = field(default_factory=dict)  # counters (tool calls, errors, ...)
    limit: str | None = None  # the limit that ended it, if one did
    versions: list[int] = field(default_factory=list)  # per token: the policy version that
    # sampled it (-1 on tokens the model did not sample)
    segments: list[int] = field(default_factory=list)  # where each segment after the first
    # starts in tokens: the whole conversation rendered again, where the chat template rewrote
    # earlier turns (hone.agents.rollout); each segment's tokens are what the model saw

    def count(self, name: str, n: int = 1) -> None:
        self.events[name] = self.events.get(name, 0) + int(n)

    @property
    def env_tokens(self) -> int:
        """Tokens after the opening that the model did not sample."""
        return len(self.tokens) - self.prompt_len - sum(self.model_mask)


@dataclass
class Switch:
    """New weights in the middle of a rollout (asynchronous RL's partial episodes): an episode's
    model turns from `turn` on (0-based) are sampled with `model()` (which may wait for the
    weights to exist), recorded as policy version `version`. Its history is prefilled again
    under the new weights and its keys go on where they were, so with the same weights the
    episode is the one it would have been without the switch."""

    turn: int
    model: Callable[[], object]
    version: int


def episode_seed(seed: int, example: int, copy: int) -> int:
    """The seed of the environment playing copy `copy` of example `example`."""
    return (seed * 1_000_003 + example * 7_919 + copy * 104_729 + 17) % (2**31 - 1)


def episode_metrics(episodes: Sequence[Episode]) -> dict[str, float]:
    """Per-step means over a batch of episodes, and the summed event counters."""
    if not episodes:
        return {}
    n = len(episodes)
    out = {"agent/turns_mean": sum(e.turns for e in episodes) / n,
           "agent/episode_tokens_mean": sum(len(e.tokens) for e in episodes) / n,
           "agent/model_tokens_mean": sum(sum(e.model_mask) for e in episodes) / n,
           "agent/env_tokens_mean": sum(e.env_tokens for e in episodes) / n,
           "agent/done_fraction": sum(e.done for e in episodes) / n,
           "agent/cut_fraction": sum(e.limit is not None for e in episodes) / n,
           "agent/segments_mean": sum(1 + len(e.segments) for e in episodes if e.tokens) / n}
    events: dict[str, int] = {}
    for e in episodes:
        for k, v in e.events.items():
            events[k] = events.get(k, 0) + v
    for k, v in sorted(events.items()):
        out[f"agent/{k}"] = float(v)
    return out
