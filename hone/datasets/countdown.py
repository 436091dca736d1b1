"""Countdown puzzles for the countdown agent (`hone.agents.tasks.Countdown`): reach a target
from three given numbers, each used exactly once, with + - * / and parentheses; and worked
traces of the calculator in use for an SFT warm start.

- A record: {"prompt": "Use 3, 7 and 25 ...", "numbers": [3, 7, 25], "target": 46}. Numbers
  are drawn from [2, 25]; the target is a whole number in [10, 99] that some expression of the
  three reaches (`solutions`), so every puzzle has an answer. Records carry no "answer" column:
  many expressions are right, so the environment's reward (`expression_reward`) is the score.
- Splits by puzzle: a fixed hash of the puzzle (its sorted numbers and target) puts about one in
  ten puzzles in the test split ("eval"), one in ten of the rest in "validation", the rest in
  "train"; no test or validation puzzle occurs in training.
- Traces (`countdown_traces`): the system prompt and calculator description the rollout shows
  (as in `calculator_traces`), the puzzle, then guess and check: half the traces first try a
  wrong expression (all three numbers, another value), read the calculator's result and try
  again; every trace then tries a right expression and answers "Answer: EXPR". A warm start
  learns the format from them; whether it also learns to check (to answer only after the
  calculator showed the target) the environment's counters say ("unchecked_answers"), and which
  expression to try is what RL has left to learn.
- Checked traces (`countdown_traces(checked=True)`, builtin:countdown-checked-traces) are the
  warm start of `CheckedCountdown`, whose calculator results say whether a try solved the
  puzzle: 0, 1 or 2 wrong tries, each result saying "not the target", then the right one.
- Expressions are written one way: "(a op b) op c" or "a op (b op c)".
- Deterministic: `random.Random(seed)`; the bundled sets use fixed seeds and sizes.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import random
from fractions import Fraction

LOW, HIGH = 2, 25  # the given numbers
TARGET_LOW, TARGET_HIGH = 10, 99
_EVAL_SHARE = 26  # out of 256: about 10% of puzzles are held out for the test split
_VALIDATION_SHARE = 26  # out of 256 of the rest: about 9% more for validation
_SIZES = {"train": 2000, "validation": 200, "eval": 200}
_OPS = "+-*/"
PROMPT = ("Use the numbers {numbers}, each exactly once, with + - * / and parentheses to make "
          "{target}.")


def _apply(x, op: str, y):
    """x op y, exact: an int while whole (fast), else a Fraction; None for a division by 0."""
    if op == "/":
        if y == 0:
            return None
        q = Fraction(x) / y
        return q.numerator if q.denominator == 1 else q
    return x + y if op == "+" else x - y if op == "-" else x * y


@functools.lru_cache(maxsize=4096)
def _expressions(numbers: tuple[int, ...]) -> tuple[tuple[str, int | Fraction], ...]:
    out = set()
    for a, b, c in set(itertools.permutations(numbers)):
        for o1, o2 in itertools.product(_OPS, repeat=2):
            left = _apply(a, o1, b)
            if left is not None and (v := _apply(left, o2, c)) is not None:
                out.add((f"({a} {o1} {b}) {o2} {c}", v))
            right = _apply(b, o2, c)
            if right is not None and (v := _apply(a, o1, right)) is not None:
                out.add((f"{a} {o1} ({b} {o2} {c})", v))
    return tuple(sorted(out, key=lambda ev: ev[0]))


def expressions(numbers) -> list[tuple[str, int | Fraction]]:
    """Every (expression, exact value) that uses the three numbers once each, in the one
    written form; division by zero left out."""
    return list(_expressions(tuple(sorted(int(n) for n in numbers))))


def solutions(numbers, target: int) -> list[str]:
    """The written expressions of `numbers` whose value is `target`."""
    return [e for e, v in expressions(numbers) if v == target]


@functools.lru_cache(maxsize=4096)
def _targets(numbers: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(sorted({v for _, v in _expressions(numbers) if type(v) is int
                         and TARGET_LOW <= v <= TARGET_HIGH and v not in numbers}))


def split_of(numbers, target: int) -> str:
    """"eval", "validation" or "train": the split the puzzle belongs to (fixed hashes)."""
    key = f"{sorted(int(n) for n in numbers)}:{int(target)}"
    if hashlib.sha256(f"countdown:{key}".encode()).digest()[0] < _EVAL_SHARE:
        return "eval"
    digest = hashlib.sha256(f"countdown-validation:{key}".encode()).digest()
    return "validation" if digest[0] < _VALIDATION_SHARE else "train"


def prompt(numbers, target: int) -> str:
    *head, last = [str(n) for n in numbers]
    return PROMPT.format(numbers=f"{', '.join(head)} and {last}", target=target)


@functools.lru_cache(maxsize=8)
def _puzzles(n: int, seed: int, split: str) -> tuple[tuple[tuple[int, ...], int], ...]:
    if split not in _SIZES:
        raise ValueError(f"split must be one of {sorted(_SIZES)}, got {split!r}")
    rng, out, seen = random.Random(seed), [], set()
    while len(out) < n:
        numbers = tuple(rng.randint(LOW, HIGH) for _ in range(3))
        reachable = _targets(tuple(sorted(numbers)))
        if not reachable:
            continue
        target = rng.choice(reachable)
        key = (tuple(sorted(numbers)), target)
        if key not in seen and split_of(numbers, target) == split:
            seen.add(key)
            out.append((numbers, target))
    return tuple(out)


def countdown_examples(n: int, seed: int, split: str = "train") -> list[dict]:
    """n distinct puzzles of `split`: {"prompt", "numbers", "target"}."""
    return [{"prompt": prompt(numbers, target), "numbers": list(numbers), "target": target}
            for numbers, target in _puzzles(n, seed, split)]


def countdown_traces(n: int, seed: int, checked: bool = False) -> list[dict]:
    """n SFT records {"messages": [system, user, (wrong try, its result,) right try, its result,
    answer]} on train-split puzzles. checked: the results as CheckedCountdown shows them (each
    says whether the try solved the puzzle) and 0, 1 or 2 wrong tries (a third each) before the
    right one, so that a warm start sees a miss answered by another try, twice at most (the
    fourth turn is the answer's)."""
    from hone.agents.calculator import calculator  # late: only traces need it; it loads JAX
    from hone.agents.parsers import HermesParser, ToolCall
    from hone.agents.tasks import COUNTDOWN_SYSTEM_PROMPT, checked_result
    from hone.agents.tools import describe_tools, tool_schema
    system = COUNTDOWN_SYSTEM_PROMPT + "\n\n" + describe_tools([tool_schema(calculator)])
    parser, rng, records = HermesParser(), random.Random(seed + 1), []
    for numbers, target in _puzzles(n, seed, "train"):
        every = expressions(numbers)
        right = rng.choice([e for e, v in every if v == target])
        tries = [right]
        wrong = [e for e, v in every if v != target]
        if checked:
            tries[:0] = rng.sample(wrong, min(rng.randrange(3), len(wrong)))
        elif rng.random() < 0.5 and wrong:
            tries.insert(0, rng.choice(wrong))
        example = {"numbers": list(numbers), "target": target}
        messages = [{"role": "system", "content": system},
                    {"role": "user", "content": prompt(numbers, target)}]
        for expression in tries:
            result = calculator(expression)
            messages += [
                {"role": "assistant", "content": parser.format(
                    [ToolCall("calculator", {"expression": expression})])},
                {"role": "tool", "name": "calculator", "content": (
                    checked_result(example, expression, result) if checked else result)}]
        messages.append({"role": "assistant", "content": f"Answer: {right}"})
        records.append({"messages": messages})
    return records


# ---- the bundled sets (fresh lists each call: callers may mutate records) --------------------

def countdown() -> list[dict]:
    return countdown_examples(_SIZES["train"], seed=51, split="train")


def countdown_validation() -> list[dict]:
    return countdown_examples(_SIZES["validation"], seed=52, split="validation")


def countdown_eval() -> list[dict]:
    return countdown_examples(_SIZES["eval"], seed=53, split="eval")


def countdown_agent_traces() -> list[dict]:
    return countdown_traces(_SIZES["train"], seed=54)


def countdown_checked_traces() -> list[dict]:
    return countdown_traces(_SIZES["train"], seed=54, checked=True)
