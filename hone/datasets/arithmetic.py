"""Procedural arithmetic word problems: the bundled data of the demo, the tiny configs and the tests.

Design choices:

- Deterministic and offline: every set comes from `random.Random(fixed seed)`; the same call gives
  the same records on every machine, so runs that use `builtin:arithmetic` are reproducible.
- Small numbers (operands and results mostly under 50, products of one-digit numbers) and a few
  fixed templates, so a 135M model learns the task in minutes and a test-sized model sees it fast.
- Held out by arithmetic fact, not only by wording: each number pair `(op, a, b)` belongs either
  to the training split or to the evaluation split (a fixed hash decides), so an eval question is
  never one the model saw in training, even under another template.
- Answers are short and always end the same way, "... The answer is N.", which
  `hone.grading.extract_answer` reads back; RL rewards and eval accuracy use `is_correct`.
- Preference pairs reject a plausible mistake: an off-by-a-little result or the wrong operation,
  written in exactly the format of the correct answer so only the arithmetic differs.
"""

from __future__ import annotations

import functools
import hashlib
import random
from dataclasses import dataclass

# (name, pronoun) pairs the templates draw from.
_PEOPLE = (("Tom", "he"), ("Anna", "she"), ("Ben", "he"), ("Lily", "she"), ("Max", "he"),
           ("Mia", "she"), ("Leo", "he"), ("Zoe", "she"), ("Sam", "he"), ("Emma", "she"))
# Countable things, plural (every count in a question or answer is at least 2).
_ITEMS = ("apples", "oranges", "pencils", "books", "marbles", "cookies", "stickers", "coins",
          "flowers", "cards", "shells", "balloons")

# Question templates per operation; `{a}`/`{b}` are the operands. The answer restates the sum.
_QUESTIONS = {
    "+": (
        "{name} has {a} {item} and buys {b} more. How many {item} does {pron} have now?",
        "{name} picks {a} {item} in the morning and {b} {item} in the afternoon. "
        "How many {item} does {pron} pick in total?",
        "There are {a} {item} in a box. {name} puts {b} more {item} in the box. "
        "How many {item} are in the box?",
    ),
    "-": (
        "{name} has {a} {item} and gives {b} of them to a friend. How many {item} does {pron} "
        "have left?",
        "There are {a} {item} on the table. {name} takes {b} {item} away. "
        "How many {item} are still on the table?",
        "{name} had {a} {item} and lost {b} of them. How many {item} does {pron} have now?",
    ),
    "*": (
        "{name} has {a} bags with {b} {item} in each bag. How many {item} does {pron} have?",
        "{name} makes {a} rows of {item} with {b} {item} in each row. "
        "How many {item} are there in total?",
    ),
}
_ANSWER = "{a} {op} {b} = {c}. The answer is {c}."

# Size and seed of each set. Seeds differ so the RL and preference prompts are new draws.
_SIZES = {"train": 2000, "eval": 200}
_SEEDS = {("sft", "train"): 11, ("sft", "eval"): 12, ("rl", "train"): 21, ("rl", "eval"): 22,
          ("pref", "train"): 31, ("pref", "eval"): 32}
_EVAL_SHARE = 10  # percent of number pairs held out for evaluation


@dataclass(frozen=True)
class Problem:
    """One word problem: `question` text and the integer `result` of `a op b`."""
    op: str
    a: int
    b: int
    question: str

    @property
    def result(self) -> int:
        return {"+": self.a + self.b, "-": self.a - self.b, "*": self.a * self.b}[self.op]

    def answer_text(self, result: int | None = None) -> str:
        """The worked answer; `result` overrides the true one (preference rejections)."""
        c = self.result if result is None else result
        return _ANSWER.format(a=self.a, op=self.op, b=self.b, c=c)


def is_eval_pair(op: str, a: int, b: int) -> bool:
    """Whether the fact `a op b` is held out for evaluation (a fixed hash, not a random draw)."""
    digest = hashlib.sha256(f"{op}{a},{b}".encode()).digest()
    return digest[0] * 100 // 256 < _EVAL_SHARE


def _draw_operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "+":
        return rng.randint(2, 30), rng.randint(2, 25)
    if op == "-":
        a = rng.randint(6, 50)
        return a, rng.randint(2, a - 2)  # the result stays >= 2: counts are plural
    return rng.randint(2, 9), rng.randint(2, 9)


@functools.lru_cache(maxsize=None)
def problems(kind: str, split: str) -> tuple[Problem, ...]:
    """The fixed problems of one set (`kind` sft/rl/pref, `split` train/eval); unique questions."""
    rng = random.Random(_SEEDS[(kind, split)])
    want_eval = split == "eval"
    out: list[Problem] = []
    seen: set[str] = set()
    while len(out) < _SIZES[split]:
        # Addition and subtraction are the bulk; multiplication tables are a smaller share.
        op = rng.choices(("+", "-", "*"), weights=(4, 4, 2))[0]
        a, b = _draw_operands(rng, op)
        if is_eval_pair(op, a, b) != want_eval:
            continue
        name, pron = rng.choice(_PEOPLE)
        template = rng.choice(_QUESTIONS[op])
        question = template.format(name=name, pron=pron, item=rng.choice(_ITEMS), a=a, b=b)
        if question not in seen:
            seen.add(question)
            out.append(Problem(op, a, b, question))
    return tuple(out)


def _wrong_result(problem: Problem, rng: random.Random) -> int:
    """A plausible mistake: the wrong operation, or a result off by a little."""
    c = problem.result
    candidates = [c + d for d in (-3, -2, -1, 1, 2, 3) if c + d >= 0]
    other = {"+": problem.a - problem.b, "-": problem.a + problem.b,
             "*": problem.a + problem.b}[problem.op]
    if other >= 0 and other != c:
        candidates.append(other)
    return rng.choice(candidates)


# ---- the bundled sets (fresh lists each call: callers may mutate records) --------------------

def _sft(split: str) -> list[dict]:
    return [{"messages": [{"role": "user", "content": p.question},
                          {"role": "assistant", "content": p.answer_text()}]}
            for p in problems("sft", split)]


def _rl(split: str) -> list[dict]:
    return [{"prompt": p.question, "answer": str(p.result)} for p in problems("rl", split)]


def _pref(split: str) -> list[dict]:
    rng = random.Random(_SEEDS[("pref", split)] + 1000)
    return [{"prompt": p.question, "chosen": p.answer_text(),
             "rejected": p.answer_text(_wrong_result(p, rng))} for p in problems("pref", split)]


def arithmetic() -> list[dict]:
    return _sft("train")


def arithmetic_eval() -> list[dict]:
    return _sft("eval")


def arithmetic_rl() -> list[dict]:
    return _rl("train")


def arithmetic_rl_eval() -> list[dict]:
    return _rl("eval")


def arithmetic_pref() -> list[dict]:
    return _pref("train")


def arithmetic_pref_eval() -> list[dict]:
    return _pref("eval")
