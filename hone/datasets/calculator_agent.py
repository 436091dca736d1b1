"""Procedural questions for the calculator agent (`hone.agents.tasks.ArithmeticTool`), and
worked traces of the tool in use for an SFT warm start.

- `calculator_examples`: {"prompt": "What is 4821 * 367?", "answer": "1769307"}: products, sums
  and differences of 3-4 digit numbers, too large for a small model to work out in its head, so
  using the tool pays.
- Held out by operand: each number in [100, 9999] belongs to the eval (test) split, the
  validation split or the train split (fixed hashes decide: about one in ten to eval, one in ten
  of the rest to validation), and a question uses operands of its split only, so no eval or
  validation question shares a number with any train question, nor with each other.
- Held out by wording too: the train wordings (`WORDINGS["train"]`: the symbolic "What is a * b?"
  forms and two plain-English forms per operation) are the only ones training data uses; the
  held-out wordings (`WORDINGS["held-out"]`: three other forms per operation, word problems
  among them) occur only in `calculator-agent-eval-wordings`, whose operands are the eval
  split's too. A model that scores there reads questions phrased in ways it never saw.
- Validation (`calculator-agent-validation`): validation operands, every other question in a
  train wording and the rest in the validation wordings (`WORDINGS["validation"]`, three more
  forms per operation that neither training nor the test sets use), so that settings (a warm
  start's length, a checkpoint) can be chosen on both kinds of held-out question without ever
  looking at the test sets.
- `calculator_traces`: conversations in which the assistant calls the calculator (written as text
  in the Hermes format, since SmolLM2's chat template has no tool support), reads its result and
  answers "4821 * 367 = 1769307"; the system message is ArithmeticTool's with the calculator
  described as the rollout describes it to such a template, so the warm start sees exactly the
  prompt RL will.
- Deterministic: `random.Random(seed)`; the bundled sets use fixed seeds and sizes.
"""

from __future__ import annotations

import functools
import hashlib
import random

LOW, HIGH = 100, 9999  # operands have 3 or 4 digits
_EVAL_SHARE = 26  # out of 256: about 10% of operands are held out for the test sets
_VALIDATION_SHARE = 26  # out of 256 of the rest: about 9% more for validation
_SYMBOLIC = ("What is {a} {op} {b}?", "Compute {a} {op} {b}.", "How much is {a} {op} {b}?")
WORDINGS = {
    "train": {
        "*": _SYMBOLIC + ("Multiply {a} by {b}.", "What is the product of {a} and {b}?"),
        "+": _SYMBOLIC + ("Add {a} and {b}.", "What is the sum of {a} and {b}?"),
        "-": _SYMBOLIC + ("Subtract {b} from {a}.", "What is the difference of {a} and {b}?"),
    },
    "held-out": {
        "*": ("A crate holds {b} bottles. How many bottles are in {a} crates?",
              "{a} times {b} makes how many?", "Calculate {a} multiplied by {b}."),
        "+": ("A library has {a} books and buys {b} more. How many books does it have now?",
              "{a} plus {b} makes how many?", "Calculate {a} increased by {b}."),
        "-": ("A tank holds {a} liters and {b} liters are drained. How many liters are left?",
              "{a} minus {b} leaves how many?", "Calculate {a} decreased by {b}."),
    },
    "validation": {
        "*": ("Each box has {b} pens. How many pens do {a} boxes hold?",
              "Find {a} times {b}.", "I need the result of multiplying {a} and {b}."),
        "+": ("A farm had {a} sheep and {b} more were born. How many sheep are there now?",
              "Find {a} plus {b}.", "I need the total of {a} and {b}."),
        "-": ("A shop had {a} apples and sold {b}. How many apples remain?",
              "Find {a} minus {b}.", "I need what remains when {b} is taken from {a}."),
    },
}
_OPS = ("*", "+", "-")
_OP_WEIGHTS = (2, 1, 1)  # products are the hard part
_SIZES = {"train": 2000, "validation": 200, "eval": 200}
# The bundled train set and traces before the wording split drew from the symbolic forms only;
# `wordings="symbolic"` still gives those (the recorded figures of 2026-12-02 used them). Train
# questions and traces drew from today's validation operands too until the validation split
# (2026-12-06); the test sets' questions did not change.
WORDINGS["symbolic"] = {op: _SYMBOLIC for op in _OPS}


def is_eval_operand(x: int) -> bool:
    """Whether the number x is held out for the eval split (a fixed hash, not a random draw)."""
    return hashlib.sha256(f"calculator:{x}".encode()).digest()[0] < _EVAL_SHARE


def split_of(x: int) -> str:
    """"eval", "validation" or "train": the split the number x belongs to (fixed hashes)."""
    if is_eval_operand(x):
        return "eval"
    digest = hashlib.sha256(f"calculator-validation:{x}".encode()).digest()
    return "validation" if digest[0] < _VALIDATION_SHARE else "train"


@functools.lru_cache(maxsize=3)
def operands(split: str) -> tuple[int, ...]:
    """The numbers questions of `split` ("train", "validation" or "eval") draw from."""
    if split not in _SIZES:
        raise ValueError(f"split must be one of {sorted(_SIZES)}, got {split!r}")
    return tuple(x for x in range(LOW, HIGH + 1) if split_of(x) == split)


def _questions(n: int, seed: int, split: str,
               wordings: str | tuple[str, ...] = "train") -> list[tuple[str, int, str, int]]:
    """n distinct (prompt, a, op, b), with a >= b for differences (answers are never negative),
    each worded with one of WORDINGS[wordings] for its operation; a tuple of wording sets takes
    them in turn (question i from wordings[i % len(wordings)])."""
    kinds = (wordings,) if isinstance(wordings, str) else tuple(wordings)
    for kind in kinds:
        if kind not in WORDINGS:
            raise ValueError(f"wordings must be among {sorted(WORDINGS)}, got {kind!r}")
    rng, pool = random.Random(seed), operands(split)
    out, seen = [], set()
    while len(out) < n:
        op = rng.choices(_OPS, weights=_OP_WEIGHTS)[0]
        a, b = rng.choice(pool), rng.choice(pool)
        if op == "-" and a < b:
            a, b = b, a
        if (a, op, b) not in seen:
            seen.add((a, op, b))
            forms = WORDINGS[kinds[len(out) % len(kinds)]][op]
            out.append((rng.choice(forms).format(a=a, op=op, b=b), a, op, b))
    return out


def _result(a: int, op: str, b: int) -> int:
    return {"*": a * b, "+": a + b, "-": a - b}[op]


def calculator_examples(n: int, seed: int, split: str = "train",
                        wordings: str | tuple[str, ...] = "train") -> list[dict]:
    """n records {"prompt", "answer", "expression"} whose operands all belong to `split`,
    worded with WORDINGS[wordings]."""
    return [{"prompt": prompt, "answer": str(_result(a, op, b)), "expression": f"{a} {op} {b}"}
            for prompt, a, op, b in _questions(n, seed, split, wordings)]


def calculator_traces(n: int, seed: int, wordings: str = "train") -> list[dict]:
    """n SFT records {"messages": [system, user, assistant tool call, tool result, answer]} on
    train-split operands, worded with WORDINGS[wordings] (never the held-out ones)."""
    if wordings in ("held-out", "validation"):
        raise ValueError(f"traces never use the {wordings} wordings")
    from hone.agents.calculator import calculator  # late: only traces need it; it loads JAX
    from hone.agents.parsers import HermesParser, ToolCall
    from hone.agents.tasks import ARITHMETIC_SYSTEM_PROMPT
    from hone.agents.tools import describe_tools, tool_schema
    # What the rollout shows a template without tool support (hone.agents.render.with_tools).
    system = ARITHMETIC_SYSTEM_PROMPT + "\n\n" + describe_tools([tool_schema(calculator)])
    parser, records = HermesParser(), []
    for prompt, a, op, b in _questions(n, seed, "train", wordings):
        expression = f"{a} {op} {b}"
        result = calculator(expression)
        call = parser.format([ToolCall("calculator", {"expression": expression})])
        records.append({"messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": prompt},
            {"role": "assistant", "content": call},
            {"role": "tool", "name": "calculator", "content": result},
            {"role": "assistant", "content": f"{expression} = {result}"}]})
    return records


# ---- the bundled sets (fresh lists each call: callers may mutate records) --------------------

def calculator_agent() -> list[dict]:
    return calculator_examples(_SIZES["train"], seed=41, split="train")


def calculator_agent_eval() -> list[dict]:
    return calculator_examples(_SIZES["eval"], seed=42, split="eval")


def calculator_agent_validation() -> list[dict]:
    """Validation operands; even questions in train wordings, odd ones in validation wordings."""
    return calculator_examples(_SIZES["validation"], seed=45, split="validation",
                               wordings=("train", "validation"))


def calculator_agent_eval_wordings() -> list[dict]:
    """The eval split's operands in the held-out wordings only."""
    return calculator_examples(_SIZES["eval"], seed=44, split="eval", wordings="held-out")


def calculator_agent_traces() -> list[dict]:
    return calculator_traces(_SIZES["train"], seed=43)
