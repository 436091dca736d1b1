"""Environments that misbehave on purpose, for the end-to-end failure test
(tests/agents/test_failures.py). The model's replies are replaced by a script of tool calls, so
every failure happens whatever the tiny random model samples."""

from __future__ import annotations

import time

import agent_tools as t
from hone.agents import Environment, Step, ToolEnvironment

SCRIPT = [
    '<tool_call>{"name": "sleepy", "arguments": {"seconds": 30}}</tool_call>',  # hangs
    '<tool_call>{"name": "broken", "arguments": {"x": 1}}</tool_call>\n'  # raises
    '<tool_call>{"name": "nothing", "arguments": {}}</tool_call>',  # returns None
    '<tool_call>{"name": "echo", "arguments": {"text": "' + "x" * 9000 + '"}}</tool_call>',
    '<tool_call>{not json}</tool_call>\n<tool_call>{"name": "nope", "arguments": {}}</tool_call>',
    "All done: 42",
]


def always_one(**_) -> float:
    return 1.0


class Faulty(ToolEnvironment):
    """Plays SCRIPT turn by turn whatever the model says; records whose "mode" asks for it
    raise in reset ("reset-raise") or in their third step ("step-raise")."""

    def __init__(self):
        super().__init__([t.sleepy, t.broken, t.nothing, t.echo], always_one, max_turns=8,
                         timeout_s=0.5)
        self.tools = None  # keep the opening short for the tiny model's context
        self.turn = 0

    def reset(self, example):
        self.mode = example.get("mode")
        if self.mode == "reset-raise":
            raise RuntimeError("reset failed")
        self.turn = 0
        return super().reset({"prompt": "go"})

    def step(self, reply):
        self.turn += 1
        if self.turn == 3 and self.mode == "step-raise":
            raise RuntimeError("step failed")
        return super().step(SCRIPT[min(self.turn, len(SCRIPT)) - 1])


class Hangs(Environment):
    """Hangs in reset ("reset-hang") or in its second step ("step-hang"), else answers "more"
    and never ends; "junk" answers with messages that are not messages."""

    def reset(self, example):
        self.mode, self.turn = example["mode"], 0
        if self.mode == "reset-hang":
            time.sleep(60)
        return [{"role": "user", "content": "hi"}]

    def step(self, reply):
        self.turn += 1
        if self.mode == "step-hang" and self.turn == 2:
            time.sleep(60)
        if self.mode == "junk":
            return Step(messages=["just a string"])
        return Step(messages=[{"role": "user", "content": "more"}])

