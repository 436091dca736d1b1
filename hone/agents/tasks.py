"""Bundled environments that need no model to test: arithmetic with a calculator tool, and a
number-guessing game.

- `ArithmeticTool`: records {"prompt": "What is 4821 * 367?", "answer": "1769307"}
  (`builtin:calculator-agent`). The system prompt tells the model to use the calculator; the
  rollout adds the tool's schema (`tools` argument, or `describe_tools` text for templates without
  tool support, such as SmolLM2's), and `builtin:calculator-traces` shows that same system text.
  Reward: 1.0 when the final reply's answer (`is_correct`: the last "The answer is N", else its
  last number) equals the record's answer, else 0.0.
- `Countdown`: records {"prompt", "numbers": [3, 7, 25], "target": 46}
  (`builtin:countdown`, hone.datasets.countdown). The model tries expressions with the
  calculator and answers "Answer: EXPR". Reward (`expression_reward`): 1.0 when the expression
  after the final reply's last "Answer:" uses each given number exactly once, only + - * / and
  parentheses, and equals the target; else 0.0. Counters "target_hits" and "unchecked_answers"
  say whether the agent answers after a try reached the target or guesses. `CheckedCountdown`:
  the same puzzles, each calculator result followed by whether it solves the puzzle.
- `GuessNumber`: a secret whole number in [lo, hi] (the record's "secret", "lo", "hi" when given,
  else drawn from self.rng); the model guesses, the environment says "higher", "lower" or
  "correct". Reward 1.0 - turn_cost * (guesses - 1) when found within max_turns, else 0.0; a reply
  without a number is answered with how to reply, counted as "bad_replies", and uses up its turn.
"""

from __future__ import annotations

import ast
import re
from collections import Counter
from fractions import Fraction

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


COUNTDOWN_SYSTEM_PROMPT = (
    "You solve number puzzles with the calculator tool. Try an expression that uses each given "
    "number exactly once with the calculator; if its result is not the target, try another. When "
    "the calculator shows the target, reply with \"Answer: \" and that expression.")
_ANSWER = re.compile(r"answer\s*:", re.IGNORECASE)
_COUNTDOWN_OPS = {ast.Add: Fraction.__add__, ast.Sub: Fraction.__sub__,
                  ast.Mult: Fraction.__mul__, ast.Div: Fraction.__truediv__}


def _countdown_value(node: ast.AST, used: list[int]) -> Fraction:
    """The exact value of a +-*/ expression of whole numbers; the numbers go to `used`."""
    if isinstance(node, ast.Constant) and type(node.value) is int:
        used.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _COUNTDOWN_OPS:
        left, right = _countdown_value(node.left, used), _countdown_value(node.right, used)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ZeroDivisionError
        return _COUNTDOWN_OPS[type(node.op)](left, right)
    raise ValueError("only whole numbers, parentheses and + - * / are allowed")


def expression_reward(example: dict, messages: list[dict], reply: str) -> float:
    """1.0 when the expression after the reply's last "Answer:" (up to the line's end or an
    "=") uses example["numbers"] each exactly once and equals example["target"], else 0.0."""
    found = list(_ANSWER.finditer(reply))
    if not found:
        return 0.0
    text = reply[found[-1].end():].split("\n", 1)[0].split("=", 1)[0].strip().rstrip(".")
    if not text or len(text) > 200:
        return 0.0
    used: list[int] = []
    try:
        value = _countdown_value(ast.parse(text, mode="eval").body, used)
    except (SyntaxError, ValueError, ZeroDivisionError, RecursionError):
        return 0.0
    numbers = [int(n) for n in example["numbers"]]
    return 1.0 if Counter(used) == Counter(numbers) and value == int(example["target"]) else 0.0


class Countdown(ToolEnvironment):
    """Reach a target from given numbers, checking tries with the bundled calculator.

    Two counters besides ToolEnvironment's say whether the agent checks its tries: "target_hits"
    (calculator calls whose expression is a solution: each number once, the target reached) and
    "unchecked_answers" (answers given before any try was a solution: a guess, whatever the
    calculator said). An agent that checks answers only after a hit, or at its last turn.
    """

    def __init__(self, *, max_turns: int = 4, timeout_s: float = 5.0, runner=None, parser=None):
        super().__init__([calculator], expression_reward, system_prompt=COUNTDOWN_SYSTEM_PROMPT,
                         max_turns=max_turns, parser=parser, timeout_s=timeout_s, runner=runner)
        self.hit = False

    def reset(self, example: dict) -> list[dict]:
        self.hit = False
        return super().reset(example)

    def step(self, reply: str) -> Step:
        step = super().step(reply)
        info = dict(step.info)
        if not step.done:  # its calls ran: count the ones that solve the puzzle
            hits = sum(c.name == "calculator" and isinstance(c.arguments.get("expression"), str)
                       and expression_reward(self.example, [], "Answer: "
                                             + c.arguments["expression"]) == 1.0
                       for c in self.calls)
            self.hit = self.hit or hits > 0
            info["target_hits"] = hits
        elif "turn_limits" not in info and not self.hit:  # it answered without a hit
            info["unchecked_answers"] = 1
        return Step(step.messages, step.reward, step.done, {k: v for k, v in info.items() if v})


def checked_result(example: dict, expression, result: str) -> str:
    """The calculator's `result` for `expression`, followed by whether the try solves the puzzle
    `example` (CheckedCountdown's tool messages, and its traces'): "46: the target. Answer with
    this expression.", "46: the target, but not with each given number once. Try another." or
    "51: not the target 46. Try another."
    """
    target = int(example["target"])
    if isinstance(expression, str) and expression_reward(
            example, [], "Answer: " + expression) == 1.0:
        return f"{result}: the target. Answer with this expression."
    if result.strip() == str(target):
        return f"{result}: the target, but not with each given number once. Try another."
    return f"{result}: not the target {target}. Try another."


class CheckedCountdown(Countdown):
    """Countdown whose calculator results say whether the try solved the puzzle
    (`checked_result`), so the agent need not compare the result with the target itself; its
    warm-start traces are builtin:countdown-checked-traces. Reward and counters as Countdown's."""

    def annotate(self, call, text: str) -> str:
        if call.name != "calculator":
            return text
        return checked_result(self.example, call.arguments.get("expression"), text)


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
