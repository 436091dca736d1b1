"""Small procedural datasets bundled with hone, by the name `data.path: builtin:NAME` uses.

Each entry of `BUILTIN` builds its records on call (deterministic, no downloads): SFT sets hold
`messages`, RL and agent sets `prompt` + `answer`, preference sets `prompt` + `chosen` + `rejected`.
"""

from __future__ import annotations

from typing import Callable

from hone.datasets import arithmetic as _arithmetic
from hone.datasets import calculator_agent as _calculator
from hone.datasets import countdown as _countdown
from hone.datasets import guess as _guess
from hone.grading import extract_answer, is_correct  # where they were first, kept for callers

BUILTIN: dict[str, Callable[[], list[dict]]] = {
    "arithmetic": _arithmetic.arithmetic,
    "arithmetic-eval": _arithmetic.arithmetic_eval,
    "arithmetic-rl": _arithmetic.arithmetic_rl,
    "arithmetic-rl-eval": _arithmetic.arithmetic_rl_eval,
    "arithmetic-pref": _arithmetic.arithmetic_pref,
    "arithmetic-pref-eval": _arithmetic.arithmetic_pref_eval,
    "calculator-agent": _calculator.calculator_agent,
    "calculator-agent-eval": _calculator.calculator_agent_eval,
    "calculator-agent-eval-wordings": _calculator.calculator_agent_eval_wordings,
    "calculator-agent-validation": _calculator.calculator_agent_validation,
    "calculator-traces": _calculator.calculator_agent_traces,
    "countdown": _countdown.countdown,
    "countdown-eval": _countdown.countdown_eval,
    "countdown-traces": _countdown.countdown_agent_traces,
    "countdown-checked-traces": _countdown.countdown_checked_traces,
    "countdown-validation": _countdown.countdown_validation,
    "guess-number": _guess.guess_number,
    "guess-number-eval": _guess.guess_number_eval,
}

__all__ = ["BUILTIN", "extract_answer", "is_correct"]
