"""The bundled arithmetic sets: deterministic, correct, held out by fact, and read back by
extract_answer / is_correct."""

import re

import pytest

from hone.datasets import BUILTIN, extract_answer, is_correct
from hone.datasets.arithmetic import is_eval_pair, problems

SETS = ("arithmetic", "arithmetic-eval", "arithmetic-rl", "arithmetic-rl-eval", "arithmetic-pref",
        "arithmetic-pref-eval")


def question(record):
    return record["messages"][0]["content"] if "messages" in record else record["prompt"]


def test_registry_names_and_sizes():
    # the calculator-agent sets are checked in tests/agents/test_tasks.py, countdown's in
    # tests/agents/test_countdown.py
    assert set(BUILTIN) == set(SETS) | {"calculator-agent", "calculator-agent-eval",
                                        "calculator-agent-eval-wordings",
                                        "calculator-agent-validation",
                                        "calculator-traces", "countdown", "countdown-eval",
                                        "countdown-traces", "countdown-checked-traces",
                                        "countdown-validation",
                                        "guess-number", "guess-number-eval"}
    for name in SETS:
        assert len(BUILTIN[name]()) == (200 if name.endswith("-eval") else 2000)


@pytest.mark.parametrize("name", SETS)
def test_deterministic_and_fresh(name):
    first, second = BUILTIN[name](), BUILTIN[name]()
    assert first == second
    first[0].clear()  # callers may mutate what they get
    assert BUILTIN[name]()[0] == second[0]


def test_record_shapes():
    sft = BUILTIN["arithmetic"]()[0]
    assert [m["role"] for m in sft["messages"]] == ["user", "assistant"]
    assert set(BUILTIN["arithmetic-rl"]()[0]) == {"prompt", "answer"}
    assert set(BUILTIN["arithmetic-pref"]()[0]) == {"prompt", "chosen", "rejected"}


@pytest.mark.parametrize("kind", ["arithmetic", "arithmetic-rl", "arithmetic-pref"])
def test_eval_questions_are_held_out(kind):
    train = {question(r) for r in BUILTIN[kind]()}
    held_out = {question(r) for r in BUILTIN[kind + "-eval"]()}
    assert len(train) == 2000 and len(held_out) == 200  # unique within each set
    assert not train & held_out


def test_eval_facts_are_held_out():
    # Not only the wording: no (op, a, b) of any eval set appears in any training set.
    train = {(p.op, p.a, p.b) for kind in ("sft", "rl", "pref") for p in problems(kind, "train")}
    held_out = {(p.op, p.a, p.b) for kind in ("sft", "rl", "pref") for p in problems(kind, "eval")}
    assert not train & held_out
    assert all(is_eval_pair(*fact) for fact in held_out)
    assert {op for op, _, _ in held_out} == {"+", "-", "*"}


def test_answers_are_right_and_small():
    for split in ("train", "eval"):
        ps = problems("sft", split)
        for p, record in zip(ps, BUILTIN["arithmetic" + ("-eval" if split == "eval" else "")]()):
            answer = record["messages"][1]["content"]
            assert answer == f"{p.a} {p.op} {p.b} = {p.result}. The answer is {p.result}."
            assert str(p.a) in p.question and str(p.b) in p.question
            assert eval(f"{p.a} {p.op} {p.b}") == p.result >= 2  # noqa: S307 (our own digits)
        numbers = [n for p in ps for n in (p.a, p.b, p.result)]
        assert max(p.a for p in ps) <= 50 and max(p.b for p in ps) <= 50
        assert sum(n < 50 for n in numbers) / len(numbers) > 0.9


def test_rl_answers_match_problems():
    for p, record in zip(problems("rl", "train"), BUILTIN["arithmetic-rl"]()):
        assert record == {"prompt": p.question, "answer": str(p.result)}


@pytest.mark.parametrize("name", ["arithmetic-pref", "arithmetic-pref-eval"])
def test_preference_pairs(name):
    pattern = re.compile(r"^\d+ [-+*] \d+ = \d+\. The answer is \d+\.$")
    for record in BUILTIN[name]():
        chosen, rejected = record["chosen"], record["rejected"]
        assert pattern.match(chosen) and pattern.match(rejected)
        # Same worked expression, different (wrong) result.
        assert chosen.split(" = ")[0] == rejected.split(" = ")[0]
        truth = eval(chosen.split(" = ")[0])  # noqa: S307 (our own digits)
        assert is_correct(chosen, truth) and not is_correct(rejected, truth)


@pytest.mark.parametrize("text, expected", [
    ("12 + 7 = 19. The answer is 19.", "19"),
    ("The answer is 19. Then 3 + 4 = 7", "19"),          # the stated answer wins
    ("first the answer is 3, no wait, the answer is 5", "5"),
    ("So we get 3 + 4 = 7", "7"),                           # else the last number
    ("THE ANSWER IS: 42", "42"),
    ("The answer is 1,200.", "1200"),
    ("the answer is -3", "-3"),
    ("the answer is 19.0", "19"),
    ("no digits here", None),
    ("", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_is_correct():
    assert is_correct("5 + 3 = 8. The answer is 8.", "8")
    assert is_correct("The answer is 8", 8)
    assert is_correct("the answer is 8.0", "8")
    assert not is_correct("The answer is 9.", "8")
    assert not is_correct("I don't know", "8")
    assert not is_correct("The answer is 18.", "8")
