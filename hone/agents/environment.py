"""Environments of multi-turn agent RL: what answers the model between its turns, and the reward.

The rollout (hone.agents.rollout) plays one episode per Environment instance:

    env = factory(); env.seed(s); messages = env.reset(example)
    loop: reply = the model's decoded turn; step = env.step(reply)
          until step.done; the episode's reward is the last step's reward

Design choices:

- Messages are OpenAI chat dicts ({"role", "content"}, tool results {"role": "tool", "name",
  "content"}), so any chat template renders them.
- Exact resume: the rollout seeds each episode (from run seed, step, episode) before reset, and
  an environment draws all its randomness from `self.rng`.
- A failure on the model's side (malformed call, unknown tool, wrong arguments, a tool that
  raises, hangs or returns junk, an overlong result) is an error message the model reads next
  turn and an event counted in `Step.info`, never an exception: one bad episode must not stop a
  run. `fallback_reward` is what the rollout gives an episode whose environment raises anyway.

`ToolEnvironment` is the generic tool-use episode: the model calls tools until it answers without
a call, and the reward function scores that final answer.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

from hone.agents.parsers import HermesParser
from hone.agents.tool_runner import make_runner
from hone.agents.tools import tool_schema

# Reward function of a ToolEnvironment, called with keywords when the model answers without a
# tool call: example (the dataset record), messages (the whole conversation, the final assistant
# reply last), reply (that final reply's text) -> a finite number.
RewardFn = Callable[..., float]


@dataclass
class Step:
    """What the environment answers to one model turn."""
    messages: list[dict] = field(default_factory=list)  # shown to the model next (empty when done)
    reward: float = 0.0  # the episode's reward; read when done
    done: bool = False  # the episode is over
    info: dict[str, int] = field(default_factory=dict)  # event counters of this step


class Environment:
    """Base class: one instance plays one episode. Subclasses set `tools` (OpenAI function
    schemas, or None) and implement reset and step, drawing randomness from `self.rng`."""

    tools: list[dict] | None = None
    fallback_reward: float = 0.0

    def __init__(self):
        self.rng = random.Random()  # replaced by seed(); unseeded episodes are not reproducible

    def seed(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def reset(self, example: dict) -> list[dict]:
        """The episode's opening messages for a dataset record."""
        raise NotImplementedError

    def step(self, reply: str) -> Step:
        """The environment's answer to the model's decoded turn."""
        raise NotImplementedError


def opening_messages(example: dict, system_prompt: str | None) -> list[dict]:
    """[system prompt] + the record's messages, or its "prompt" as one user message."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    if "messages" in example:
        return system + [dict(m) for m in example["messages"]]
    return system + [{"role": "user", "content": example["prompt"]}]


def _cut(text: str, limit: int) -> tuple[str, bool]:
    if len(text) <= limit:
        return text, False
    return text[:limit] + f"...[cut {len(text) - limit} characters]", True


class ToolEnvironment(Environment):
    """The model calls tools until it answers without a tool call; `reward` scores that answer.

    tools: module-level functions with type hints and docstrings (see hone.agents.tools).
    reward: `reward(example=..., messages=..., reply=...) -> float` (see RewardFn above); one that
        raises or returns a non-number gives `fallback_reward`, counted as "reward_errors".
    max_turns: the most model turns; a turn that still calls tools at the limit ends the episode
        unanswered: its calls are not run, the reward is 0.0, counted as "turn_limits".
    parser: an object with parse(reply) -> (calls, malformed); HermesParser by default.
    runner: None (the shared worker-process runner), "inline", or a runner object.
    Counters in Step.info: tool_calls (every call attempted, malformed ones too), malformed_calls,
    unknown_tools, tool_errors, tool_timeouts, tool_bad_results, tool_results_cut, reward_errors,
    turn_limits.
    """

    def __init__(self, tools: list[Callable], reward: RewardFn, *, system_prompt: str | None = None,
                 max_turns: int | None = None, parser=None, timeout_s: float = 10.0,
                 max_result_chars: int = 8192, runner=None, fallback_reward: float = 0.0):
        super().__init__()
        self.functions = {fn.__name__: fn for fn in tools}
        if len(self.functions) != len(tools):
            raise ValueError(f"two tools share a name: {[fn.__name__ for fn in tools]}")
        self.tools = [tool_schema(fn) for fn in tools] or None
        self.reward = reward
        self.system_prompt = system_prompt
        self.max_turns = max_turns
        self.parser = parser if parser is not None else HermesParser()
        self.timeout_s = timeout_s
        self.max_result_chars = max_result_chars
        self.runner = make_runner(runner)
        for fn in tools:
            self.runner.check(fn)
        self.fallback_reward = fallback_reward
        self.example: dict = {}
        self.messages: list[dict] = []  # the conversation so far, opening messages included
        self.turns = 0
        self.done = False
        self.reward_error: str | None = None
        self.calls: list = []

    def reset(self, example: dict) -> list[dict]:
        self.example, self.turns, self.done = example, 0, False
        self.messages = opening_messages(example, self.system_prompt)
        return [dict(m) for m in self.messages]

    def step(self, reply: str) -> Step:
        if self.done:
            raise RuntimeError("step() after the episode ended; build a new environment")
        self.turns += 1
        self.messages.append({"role": "assistant", "content": reply})
        calls, malformed = self.parser.parse(reply)
        self.calls = calls  # this turn's well-formed calls, for subclasses that score them
        info: Counter = Counter()
        if not calls and not malformed:
            return self._finish(reply, info)
        if self.max_turns is not None and self.turns >= self.max_turns:
            self.done = True
            return Step([], 0.0, True, {"turn_limits": 1})
        out = []
        for call in calls:
            info["tool_calls"] += 1
            if call.name not in self.functions:
                ok, text, event = False, (f"error: unknown tool {call.name!r}; tools: "
                                          f"{', '.join(self.functions)}"), "unknown_tools"
            else:
                ok, text, event = self.runner.call(self.functions[call.name], call.arguments,
                                                   self.timeout_s)
                if ok:
                    text = self.annotate(call, text)
            if event:
                info[event] += 1
            text, cut = _cut(text, self.max_result_chars)
            info["tool_results_cut"] += cut
            out.append({"role": "tool", "name": call.name, "content": text})
        for _ in range(malformed):  # the parser does not say where: one message per block
            info["tool_calls"] += 1
            info["malformed_calls"] += 1
            out.append({"role": "tool", "name": "", "content": (
                "error: malformed tool call; write <tool_call>\n{\"name\": \"TOOL_NAME\", "
                "\"arguments\": {...}}\n</tool_call> with valid JSON and the arguments as an "
                "object")})
        self.messages.extend(out)
        return Step([dict(m) for m in out], 0.0, False, _counts(info))

    def annotate(self, call, text: str) -> str:
        """The message a tool's successful result is shown as (a subclass may add what the
        environment knows, e.g. whether a try reached the goal); the result itself here."""
        return text

    def _finish(self, reply: str, info: Counter) -> Step:
        """The episode's end: the model answered without a tool call."""
        self.done = True
        try:
            value = self.reward(example=self.example, messages=[dict(m) for m in self.messages],
                                reply=reply)
            reward = float(value)
            if isinstance(value, str) or not math.isfinite(reward):
                raise ValueError(f"the reward function returned {value!r}, not a finite number")
        except Exception as err:
            self.reward_error = f"{type(err).__name__}: {err}"  # for whoever debugs the reward
            reward = self.fallback_reward
            info["reward_errors"] += 1
        return Step([], reward, True, _counts(info))


def _counts(info: Counter) -> dict[str, int]:
    return {k: int(v) for k, v in info.items() if v}
