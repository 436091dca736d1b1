"""The bundled tasks: the calculator is exact and bounded, ArithmeticTool plays the bundled traces
to reward 1, GuessNumber is won by binary search, and the calculator sets hold out operands."""

import math
import random
import re
import time

import pytest

from hone.agents.calculator import calculator
from hone.agents.parsers import HermesParser, ToolCall
from hone.agents.tasks import ARITHMETIC_SYSTEM_PROMPT, ArithmeticTool, GuessNumber
from hone.agents.tools import describe_tools, tool_schema
from hone.datasets import BUILTIN
from hone.datasets.calculator_agent import (LOW, HIGH, WORDINGS, calculator_examples,
                                            calculator_traces, is_eval_operand, operands,
                                            split_of)


@pytest.mark.parametrize("expression, result", [
    ("4821 * 367", "1769307"),
    ("(1 + 2) * 3 - 4 / 8", "8.5"),
    ("7 / 4", "1.75"),
    ("0.1 + 0.2", "0.3"),  # decimals read exactly, not as floats
    ("2 / 3", "0.666666666667"),  # not terminating: 12 digits, rounded half-even
    ("-1 / 3", "-0.333333333333"),
    ("1 / 8000000000000", "0"),  # rounds to zero, written without a sign
    ("-7 // 2", "-4"),
    ("-7 % 3", "2"),
    ("2 ** -2", "0.25"),
    ("2 ** 100", "1267650600228229401496703205376"),
    ("1e3 + 1_000", "2000"),
    (" +-5 ", "-5"),
    ("(" * 200 + "1" + ")" * 200, "1"),
])
def test_calculator_is_exact(expression, result):
    assert calculator(expression) == result


def test_calculator_products_and_sums_of_the_dataset_sizes():
    rng = random.Random(0)
    for _ in range(50):
        a, b = rng.randint(100, 9999), rng.randint(100, 9999)
        assert calculator(f"{a} * {b}") == str(a * b)
        assert calculator(f"{a}-{b}") == str(a - b)


@pytest.mark.parametrize("expression, says", [
    ("9**9**9", "too large"),
    ("10 ** 5000", "too large"),
    ("1e999999999", "too large"),
    ("2 ** 0.5", "whole-number exponents"),
    ("1 / 0", "division by zero"),
    ("0 ** -1", "division by zero"),
    ("__import__('os').system('true')", "unsupported input"),
    ("x + 1", "unsupported input"),
    ("True + 1", "unsupported input"),
    ("3 & 1", "unsupported operator"),
    ("1 +", "not an arithmetic expression"),
    ("1" * 1001, "too long"),
    ("(" * 300 + "1" + ")" * 300, "not an arithmetic expression"),  # Python's parser refuses
    ("-" * 999 + "1", "nested too deeply"),  # the walk itself would recurse too deep
])
def test_calculator_refuses_quickly(expression, says):
    start = time.monotonic()
    with pytest.raises(ValueError, match=says):
        calculator(expression)
    assert time.monotonic() - start < 5  # bounded: never computes a giant power


# ---- ArithmeticTool ------------------------------------------------------------------------

def test_arithmetic_tool_plays_the_bundled_traces_to_reward_one():
    fmt = HermesParser().format
    for record in calculator_traces(3, seed=5):
        system, user, call, result, final = record["messages"]
        env = ArithmeticTool(runner="inline")
        assert system["content"] == ARITHMETIC_SYSTEM_PROMPT + "\n\n" + describe_tools(env.tools)
        expression = final["content"].split(" = ")[0]  # "4821 * 367", however it was worded
        a, _, b = expression.split()
        assert sorted(numbers(user["content"])) == sorted([int(a), int(b)])
        assert call["content"] == fmt([ToolCall("calculator", {"expression": expression})])
        answer = final["content"].split(" = ")[1]
        assert env.reset({"prompt": user["content"], "answer": answer}) == [
            {"role": "system", "content": ARITHMETIC_SYSTEM_PROMPT}, user]
        step = env.step(call["content"])
        assert step.messages == [result] and not step.done
        assert env.step(final["content"]).reward == 1.0


@pytest.mark.parametrize("reply, reward", [
    ("4821 * 367 = 1769307", 1.0), ("The answer is 1,769,307.", 1.0),
    ("1769307, not 1769308", 0.0), ("I do not know.", 0.0)])
def test_arithmetic_tool_reward(reply, reward):
    env = ArithmeticTool(runner="inline")
    assert env.tools == [tool_schema(calculator)]
    env.reset({"prompt": "What is 4821 * 367?", "answer": "1769307"})
    assert env.step(reply).reward == reward


# ---- GuessNumber ---------------------------------------------------------------------------

def binary_search(env, lo, hi):
    """Plays the game by halving; returns (final step, turns)."""
    turns = 0
    while True:
        guess = (lo + hi) // 2
        turns += 1
        step = env.step(f"My guess is {guess}.")
        if step.done:
            return step, turns
        [message] = step.messages
        assert message["role"] == "user"
        lo, hi = (guess + 1, hi) if message["content"] == "higher" else (lo, guess - 1)


@pytest.mark.parametrize("lo, hi, secret", [(1, 100, 1), (1, 100, 100), (1, 100, 37),
                                            (-5, 5, 0), (7, 7, 7), (1, 1000, 999)])
def test_guess_number_binary_search_wins_within_log2_turns(lo, hi, secret):
    env = GuessNumber(max_turns=12)
    opening = env.reset({"lo": lo, "hi": hi, "secret": secret})
    assert f"from {lo} to {hi}" in opening[0]["content"]
    step, turns = binary_search(env, lo, hi)
    assert step == type(step)([], 1.0, True, {})
    assert turns <= math.ceil(math.log2(hi - lo + 1)) + 1


def test_guess_number_secret_from_the_seeded_rng():
    secrets = []
    for seed in (4, 4, 5):
        env = GuessNumber(lo=1, hi=10**6)
        env.seed(seed)
        env.reset({})
        secrets.append(env.secret)
    assert secrets[0] == secrets[1] != secrets[2]
    assert all(1 <= s <= 10**6 for s in secrets)


def test_guess_number_bad_reply_turn_cost_and_turn_limit():
    env = GuessNumber(lo=1, hi=10, max_turns=3, turn_cost=0.1)
    env.reset({"secret": 4})
    step = env.step("no idea")
    assert step.messages == [{"role": "user",
                              "content": "Reply with one whole number from 1 to 10."}]
    assert (step.done, step.info) == (False, {"bad_replies": 1})
    assert env.step("5").messages == [{"role": "user", "content": "lower"}]
    assert env.step("4").reward == pytest.approx(0.8)  # found on the third guess: 1 - 2 * 0.1

    env = GuessNumber(lo=1, hi=10, max_turns=2)
    env.reset({"secret": 4})
    assert env.step("1").messages == [{"role": "user", "content": "higher"}]
    assert env.step("2") == type(step)([], 0.0, True, {})


# ---- the calculator sets -------------------------------------------------------------------

def numbers(prompt):
    return [int(n) for n in re.findall(r"\d+", prompt)]


def test_builtin_sets_hold_out_operands():
    train, held_out = BUILTIN["calculator-agent"](), BUILTIN["calculator-agent-eval"]()
    assert (len(train), len(held_out)) == (2000, 200)
    train_ops = {n for r in train for n in numbers(r["prompt"])}
    eval_ops = {n for r in held_out for n in numbers(r["prompt"])}
    assert train_ops and eval_ops and not train_ops & eval_ops
    assert all(is_eval_operand(n) for n in eval_ops)
    splits = [set(operands(s)) for s in ("train", "validation", "eval")]
    assert set.union(*splits) == set(range(LOW, HIGH + 1)) and sum(map(len, splits)) == 9900
    assert 0.05 < len(operands("eval")) / (HIGH - LOW + 1) < 0.15
    assert 0.05 < len(operands("validation")) / (HIGH - LOW + 1) < 0.15


def test_validation_set_shares_nothing_with_training_or_the_test_sets():
    """calculator-agent-validation: its own operands (none in any train or test question), every
    other question in a train wording and the rest in validation wordings, which no other set
    uses; the test sets are what they were before the validation split."""
    def form(prompt):
        return re.sub(r"\d+", "#", prompt)

    forms = {which: {form(t.format(a=1, b=1, op=op)) for op, ts in WORDINGS[which].items()
                     for t in ts} for which in ("train", "validation", "held-out")}
    assert not forms["validation"] & (forms["train"] | forms["held-out"])
    val = BUILTIN["calculator-agent-validation"]()
    assert len(val) == 200 and len({r["expression"] for r in val}) == 200
    assert all(split_of(n) == "validation" for r in val for n in numbers(r["prompt"]))
    assert all(form(r["prompt"]) in forms["train"] for r in val[0::2])
    assert {form(r["prompt"]) for r in val[1::2]} == forms["validation"]
    others = (BUILTIN["calculator-agent"]() + BUILTIN["calculator-agent-eval"]()
              + BUILTIN["calculator-agent-eval-wordings"]()
              + [{"prompt": r["messages"][1]["content"]} for r in BUILTIN["calculator-traces"]()])
    assert not {n for r in val for n in numbers(r["prompt"])} & {
        n for r in others for n in numbers(r["prompt"])}
    # The test sets' first questions as recorded before the split (RESULTS.md compares them).
    assert BUILTIN["calculator-agent-eval"]()[0]["expression"] == "412 + 7544"
    assert BUILTIN["calculator-agent-eval-wordings"]()[0]["expression"] == "5426 * 7065"


def test_examples_are_correct_deterministic_and_distinct():
    records = calculator_examples(300, seed=9, split="eval")
    assert records == calculator_examples(300, seed=9, split="eval")
    assert len({r["prompt"] for r in records}) == 300
    ops = set()
    for r in records:
        a, op, b = r["expression"].split()
        assert sorted(numbers(r["prompt"])) == sorted([int(a), int(b)])
        ops.add(op)
        assert LOW <= int(a) <= HIGH and LOW <= int(b) <= HIGH
        assert r["answer"] == calculator(f"{a} {op} {b}") and int(r["answer"]) >= 0
    assert ops == {"*", "+", "-"}


def test_traces_builtin():
    records = BUILTIN["calculator-traces"]()
    assert len(records) == 2000
    roles = [m["role"] for m in records[0]["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "assistant"]
    assert records[0]["messages"][3]["name"] == "calculator"


def test_held_out_wordings_never_occur_in_training_data():
    """The wording split: every question of calculator-agent and calculator-traces is in a train
    wording, every one of calculator-agent-eval-wordings in a held-out wording (and held-out
    operands), and the two sets of forms share none."""
    def form(prompt):
        return re.sub(r"\d+", "#", prompt)

    def forms(which):
        return {form(t.format(a=1, b=1, op=op)) for op, ts in WORDINGS[which].items() for t in ts}

    train_forms, held_out_forms = forms("train"), forms("held-out")
    assert not train_forms & held_out_forms and len(held_out_forms) == 9
    train = BUILTIN["calculator-agent"]() + [
        {"prompt": r["messages"][1]["content"]} for r in BUILTIN["calculator-traces"]()]
    assert {form(r["prompt"]) for r in train} == train_forms  # every train form is used
    worded = BUILTIN["calculator-agent-eval-wordings"]()
    assert {form(r["prompt"]) for r in worded} == held_out_forms and len(worded) == 200
    assert all(is_eval_operand(n) for r in worded for n in numbers(r["prompt"]))
    for r in worded:
        assert r["answer"] == calculator(r["expression"])
    with pytest.raises(ValueError, match="held-out"):
        calculator_traces(1, seed=0, wordings="held-out")
    with pytest.raises(ValueError, match="validation"):
        calculator_traces(1, seed=0, wordings="validation")
