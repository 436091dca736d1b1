"""Bundled environments that need no model to test: arithmetic with a calculator tool, and a
number-guessing game.

- `ArithmeticTool`: records {"prompt": "What is 4821 * 367?", "answer": "1769307"}
  (`builtin:calculator-agent`). The system prompt tells the model to use the calculator; the
  rollout adds the tool's schema (`tools` argument, or `describe_tools` text for templates without
  tool support, such as SmolLM2's), and `builtin:calculator-traces` shows that same system text.
  Reward: 1.0 when the final reply's answer (`is_correct`: the last "The answer is N", else its
  last number) equals the record's answer, else 0.0.
- `GuessNumber`: a secret whole number in [lo, hi] (the record's "secret", "lo", "hi" when given,
  else drawn from self.rng); the model guesses, the environment says "higher", "lower" or
  "correct". Reward 1.0 - turn_cost * (guesses - 1) when found within max_turns, else 0.0; a reply
  without a number is answered with how to reply, counted as "bad_replies", and uses up its turn.
"""

from __future__ import annotations

import re

from hone.agents.calculator import calculator
from hone.agents.environment import Environment, Step, ToolEnvironment
from hone.grading import is_correct

# The tool itself is shown by the rollout (hone.agents.render.with_tools): as the template's
# `tools` argument, or for templates without tool support as describe_tools text appended here.
ARITHMETIC_SYSTEM_PROMPT = (
    "You solve arithmetic questions with the calculator tool. Call it for every calculation "
    "instead of working it out yourself, then give the final answer in one short sentence that "
    "ends with the number.")


def answer_reward(example: dict, messages: list[dict], reply: str) -> float:
    """1.0 when the final reply's answer equals example["answer"] as a number, else 0.0."""
    return 1.0 if is_correct(reply, example["answer"]) else 0.0


class ArithmeticTool(ToolEnvironment):
    """Arithmetic questions answered with the bundled calculator."""

    def __init__(self, *, max_turns: int = 4, timeout_s: float = 5.0, runner=None, parser=None):
        super().__init__([calculator], answer_reward, system_prompt=ARITHMETIC_SYSTEM_PROMPT,
                         max_turns=max_turns, parser=parser, timeout_s=timeout_s, runner=runner)


_INTEGER = re.compile(r"-?\d+")


class GuessNumber(Environment):
    """Find a secret whole number in [lo, hi]; each guess is answered higher, lower or correct."""

    def __init__(self, lo: int = 1, hi: int = 100, max_turns: int = 10, turn_cost: float = 0.0):
        super().__init__()
        if lo > hi or max_turns < 1:
            raise ValueError(f"need lo <= hi and max_turns >= 1, got {lo}, {hi}, {max_turns}")
        self.lo, self.hi, self.max_turns, self.turn_cost = lo, hi, max_turns, turn_cost
        self.secret = lo
        self.turns = 0
        self.done = False

    def reset(self, example: dict) -> list[dict]:
        self.lo, self.hi = int(example.get("lo", self.lo)), int(example.get("hi", self.hi))
        self.secret = (int(example["secret"]) if "secret" in example
                       else self.rng.randint(self.lo, self.hi))
        self.turns, self.done = 0, False
        return [{"role": "user", "content": (
            f"I am thinking of a whole number from {self.lo} to {self.hi}. Guess it: reply with "
            f"one number. After each guess I say higher, lower or correct. You have "
            f"{self.max_turns} guesses.")}]

    def step(self, reply: str) -> Step:
        if self.done:
            raise RuntimeError("step() after the episode ended; build a new environment")
        self.turns += 1
        last = self.turns >= self.max_turns
        # int() refuses 4300+ digits; no guess in range has more than 100 anyway
        numbers = [n for n in _INTEGER.findall(reply) if len(n) <= 100]
        if not numbers:
            self.done = last
            text = f"Reply with one whole number from {self.lo} to {self.hi}."
            return Step([] if last else [{"role": "user", "content": text}], 0.0, last,
                        {"bad_replies": 1})
        guess = int(numbers[-1])
        if guess == self.secret:
            self.done = True
            return Step([], 1.0 - self.turn_cost * (self.turns - 1), True, {})
        self.done = last
        answer = "higher" if self.secret > guess else "lower"
        return Step([] if last else [{"role": "user", "content": answer}], 0.0, last, {})
