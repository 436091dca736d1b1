"""The countdown task: every bundled puzzle is solvable and its splits share no puzzle, the
traces play to reward 1 through the environment, and the reward takes an answer only when it
uses each given number exactly once and makes the target."""

import re
from collections import Counter
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.agents.calculator import calculator
from hone.agents.parsers import HermesParser, ToolCall
from hone.agents.tasks import (COUNTDOWN_SYSTEM_PROMPT, CheckedCountdown, Countdown,
                               checked_result, expression_reward)
from hone.agents.tools import describe_tools
from hone.datasets import BUILTIN
from hone.datasets.countdown import (HIGH, LOW, TARGET_HIGH, TARGET_LOW, countdown_examples,
                                     countdown_traces, expressions, prompt, solutions, split_of)

PUZZLE = {"prompt": prompt([3, 7, 25], 46), "numbers": [3, 7, 25], "target": 46}


@pytest.mark.parametrize("reply, reward", [
    ("Answer: 3 * 7 + 25", 1.0),
    ("Answer: (3 * 7) + 25 = 46.", 1.0),  # "= target" and a full stop are allowed
    ("I tried twice.\nanswer:25 + 7 * 3\n", 1.0),  # the last line with "Answer:", any case
    ("Answer: 25 + 21", 0.0),  # 21 is not a given number
    ("Answer: 3 * 7 + 25 + 0", 0.0),  # a number not given
    ("Answer: (25 - 3) * 7 - 108", 0.0),
    ("Answer: 25 + 3 * 7 * 1", 0.0),
    ("Answer: 3 * 7 + 25 + 25 - 25", 0.0),  # 25 three times
    ("Answer: 46", 0.0),
    ("Answer: 3 ** 2 + 25", 0.0),  # not one of + - * /
    ("Answer: -3 * -7 + 25", 0.0),  # no unary minus: "-3" is not a given number
    ("Answer: 3.0 * 7 + 25", 0.0),
    ("Answer: 7 / (3 - 3) + 25", 0.0),
    ("3 * 7 + 25 = 46", 0.0),  # no "Answer:"
    ("Answer: 3 * 7 + 25\nAnswer: 3 + 7 + 25", 0.0),  # the last answer counts
    ("Answer: __import__('os')", 0.0),
    ("Answer: " + "(" * 300 + "3" + ")" * 300, 0.0),
])
def test_reward_needs_each_number_once_and_the_target(reply, reward):
    assert expression_reward(example=PUZZLE, messages=[], reply=reply) == reward


def test_reward_is_exact_with_fractions():
    example = {"numbers": [3, 8, 24], "target": 9}
    assert expression_reward(example=example, messages=[], reply="Answer: 24 / (8 / 3)") == 1.0
    assert expression_reward(example=example, messages=[], reply="Answer: 24 / 8 / 3") == 0.0


def test_expressions_by_hand():
    every = dict(expressions([2, 3, 4]))
    assert every["(2 + 3) * 4"] == 20 and every["2 + (3 * 4)"] == 14
    assert every["(2 / 3) * 4"] == Fraction(8, 3) and every["2 - (3 - 4)"] == 3
    assert len(every) == 6 * 16 * 2  # no zero to divide by: every order, op pair and grouping
    assert solutions([2, 3, 4], 24) == ["(2 * 3) * 4", "(2 * 4) * 3", "(3 * 2) * 4",
                                        "(3 * 4) * 2", "(4 * 2) * 3", "(4 * 3) * 2",
                                        "2 * (3 * 4)", "2 * (4 * 3)", "3 * (2 * 4)",
                                        "3 * (4 * 2)", "4 * (2 * 3)", "4 * (3 * 2)"]
    assert "(5 / (3 - 3))" not in str(expressions([5, 3, 3]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(LOW, HIGH), min_size=3, max_size=3))
def test_every_expression_is_worth_its_value(numbers):
    for text, value in expressions(numbers)[::7]:
        assert Counter(int(n) for n in re.findall(r"\d+", text)) == Counter(numbers)
        assert Fraction(calculator(text)) == value or value.denominator > 1
        if value.denominator == 1 and TARGET_LOW <= value <= TARGET_HIGH:
            example = {"numbers": numbers, "target": int(value)}
            assert expression_reward(example=example, messages=[],
                                     reply=f"Answer: {text}") == 1.0


def test_bundled_puzzles_are_solvable_distinct_and_split():
    sets = {name: BUILTIN[name]() for name in ("countdown", "countdown-validation",
                                               "countdown-eval")}
    assert [len(s) for s in sets.values()] == [2000, 200, 200]
    keys = {}
    for name, records in sets.items():
        split = {"countdown": "train", "countdown-validation": "validation",
                 "countdown-eval": "eval"}[name]
        keys[name] = {(tuple(sorted(r["numbers"])), r["target"]) for r in records}
        assert len(keys[name]) == len(records)
        for r in records:
            assert split_of(r["numbers"], r["target"]) == split
            assert r["prompt"] == prompt(r["numbers"], r["target"])
            assert all(LOW <= n <= HIGH for n in r["numbers"])
            assert TARGET_LOW <= r["target"] <= TARGET_HIGH and r["target"] not in r["numbers"]
            assert solutions(r["numbers"], r["target"]) and "answer" not in r
    assert not keys["countdown"] & keys["countdown-eval"]
    assert not keys["countdown"] & keys["countdown-validation"]
    assert not keys["countdown-validation"] & keys["countdown-eval"]
    assert countdown_examples(5, seed=52, split="validation") == sets["countdown-validation"][:5]


@pytest.mark.parametrize("checked", [False, True])
def test_traces_play_to_reward_one_through_the_environment(checked):
    """Plain traces try once or twice, checked ones one to three times (each result saying
    whether it solved the puzzle); either kind replays message for message through its
    environment and ends with reward 1."""
    fmt = HermesParser().format
    traces = countdown_traces(40, seed=9, checked=checked)
    tries = Counter((len(t["messages"]) - 3) // 2 for t in traces)
    assert sorted(tries) == ([1, 2, 3] if checked else [1, 2])
    for record in traces:
        system, user, *turns, final = record["messages"]
        numbers = [int(n) for n in re.findall(r"\d+", user["content"])]
        example = {"prompt": user["content"], "numbers": numbers[:3], "target": numbers[3]}
        assert split_of(example["numbers"], example["target"]) == "train"
        env = (CheckedCountdown if checked else Countdown)(runner="inline")
        assert system["content"] == (COUNTDOWN_SYSTEM_PROMPT + "\n\n"
                                     + describe_tools(env.tools))
        env.reset(example)
        for call, result in zip(turns[::2], turns[1::2]):
            expression = re.search(r'"expression": "([^"]+)"', call["content"]).group(1)
            assert call["content"] == fmt([ToolCall("calculator", {"expression": expression})])
            step = env.step(call["content"])
            assert step.messages == [result] and not step.done
        target = str(example["target"])  # the last try makes it, the ones before it did not
        if checked:
            assert turns[-1]["content"] == f"{target}: the target. Answer with this expression."
            assert all(t["content"].endswith(f": not the target {target}. Try another.")
                       for t in turns[1:-2:2])
        else:
            assert turns[-1]["content"] == target
            assert all(t["content"] != target for t in turns[1:-2:2])
        step = env.step(final["content"])
        assert step.done and step.reward == 1.0


def test_environment_turn_limit_and_a_wrong_answer():
    env = Countdown(runner="inline", max_turns=2)
    env.reset(PUZZLE)
    call = HermesParser().format([ToolCall("calculator", {"expression": "3 + 7 + 25"})])
    assert env.step(call).messages[0]["content"] == "35"
    step = env.step(call)
    assert step.done and step.reward == 0.0 and step.info == {"turn_limits": 1}
    env = Countdown(runner="inline")
    env.reset(PUZZLE)
    assert env.step("Answer: 3 + 7 + 25").reward == 0.0


def test_counters_tell_a_checked_answer_from_a_guess():
    call = lambda expr: HermesParser().format(  # noqa: E731
        [ToolCall("calculator", {"expression": expr})])
    env = Countdown(runner="inline")
    env.reset(PUZZLE)
    assert env.step(call("3 + 7 + 25")).info == {"tool_calls": 1}  # 35: a miss
    assert env.step(call("25 + 21")).info == {"tool_calls": 1}  # 46, but 21 is not given
    assert env.step("Answer: 3 * 7 + 25").info == {"unchecked_answers": 1}  # right, a guess
    env = Countdown(runner="inline")
    env.reset(PUZZLE)
    assert env.step(call("(3 * 7) + 25")).info == {"tool_calls": 1, "target_hits": 1}
    step = env.step("Answer: (3 * 7) + 25")
    assert step.reward == 1.0 and step.info == {}  # answered after its hit
    env.reset(PUZZLE)  # a new episode forgets the hit
    assert env.step("Answer: 1").info == {"unchecked_answers": 1}


def test_checked_results_say_whether_the_try_solved_the_puzzle():
    call = lambda expr: HermesParser().format(  # noqa: E731
        [ToolCall("calculator", {"expression": expr})])
    env = CheckedCountdown(runner="inline")
    env.reset(PUZZLE)
    said = lambda expr: env.step(call(expr)).messages[0]["content"]  # noqa: E731
    assert said("3 + 7 + 25") == "35: not the target 46. Try another."
    assert said("25 + 21") == "46: the target, but not with each given number once. Try another."
    step = env.step(call("(3 * 7) + 25"))
    assert step.messages[0]["content"] == "46: the target. Answer with this expression."
    assert step.info == {"tool_calls": 1, "target_hits": 1}
    step = env.step("Answer: (3 * 7) + 25")
    assert step.done and step.reward == 1.0
    env.reset(PUZZLE)  # errors and other tools' results are shown as they are
    assert said("3 +").startswith("error: ")
    assert checked_result(PUZZLE, None, "46") == (
        "46: the target, but not with each given number once. Try another.")
    assert Countdown(runner="inline").annotate(ToolCall("calculator", {}), "35") == "35"


@pytest.mark.real_model
@pytest.mark.parametrize("task", ["countdown", "countdown-checked"])
def test_configs_fit_the_openings_and_traces_in_smollm2s_template(task):
    """The configs with the settings benchmarks/agent_selection.py gives each task."""
    import sys
    from pathlib import Path

    from hone.config import COMMANDS, load_config
    from hone.tokenizer import load_tokenizer
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from agent_selection import TASKS
    t = TASKS[task]
    sft = load_config(COMMANDS["sft"], str(root / t["sft"]), t.get("sft_set", []))
    grpo = load_config(COMMANDS["grpo"], str(root / t["grpo"]), t.get("grpo_task_set", []))
    checked = task == "countdown-checked"
    assert grpo.agent.environment == ("hone.agents.tasks:CheckedCountdown" if checked
                                      else "hone.agents.tasks:Countdown")
    assert sft.data.path == t["traces"] and grpo.data.path == "builtin:countdown"
    tok = load_tokenizer(sft.model.source)
    count = lambda messages, more: len(tok.encode(  # noqa: E731
        tok.apply_chat_template(messages, add_generation_prompt=more)))
    traces = countdown_traces(200, seed=54, checked=checked)
    assert max(count(t["messages"], False) for t in traces) <= sft.data.max_length
    openings = [count(t["messages"][:2], True) for t in traces]
    assert max(openings) <= grpo.grpo.max_prompt_tokens
    # three tries of the longest form with their results, and an answer, fit an episode
    longest = max(traces, key=lambda t: count(t["messages"], False))
    tries = [m for m in longest["messages"][2:-1]][-2:] * 3 + [longest["messages"][-1]]
    assert count(longest["messages"][:2] + tries, False) <= grpo.agent.max_episode_tokens
