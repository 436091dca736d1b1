"""Grading an answer: the final number a reply gives, and whether it equals the reference.

Every task hone bundles (arithmetic word problems, the calculator agent, guess-the-number) has a
numeric answer, so one reader serves the RL rewards (`answer_match`), task accuracy, the agents'
environments and distillation's answer agreement. It lives on a low floor so that data sets,
rewards, evaluation and agents import it, never one of them from another.

Design choices:
- The last "The answer is N" wins (the format the bundled answers are written in); without one,
  the last number in the text. A model that states its answer and then keeps talking is read by
  what it said last.
- Numbers compare as numbers written one way: thousands separators dropped, "19.0" is "19", and
  "-0" is "0", so a correct answer is never failed for its spelling.
"""

from __future__ import annotations

import re

NUMBER_PATTERN = r"-?\d[\d,]*(?:\.\d+)?"
_FINAL = re.compile(r"answer\s+is\s*:?\s*\$?(" + NUMBER_PATTERN + ")", re.IGNORECASE)
_ANY = re.compile(NUMBER_PATTERN)


def normalize_number(number: str) -> str:
    """'1,200' -> '1200', '19.0' -> '19', '-0' -> '0'; other text is returned stripped."""
    text = number.strip().replace(",", "")
    try:
        value = float(text)
    except ValueError:
        return text
    return str(int(value)) if value.is_integer() else repr(value)


def extract_answer(text: str) -> str | None:
    """The final answer in `text`: the last "The answer is N", else the last number; or None."""
    finals = _FINAL.findall(text)
    if finals:
        return normalize_number(finals[-1])
    numbers = _ANY.findall(text)
    return normalize_number(numbers[-1]) if numbers else None


def is_correct(text: str, answer: str | int) -> bool:
    """Whether the answer extracted from `text` equals `answer` as a number."""
    found = extract_answer(text)
    return found is not None and found == normalize_number(str(answer))
