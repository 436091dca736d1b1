"""ToolEnvironment: opening messages, tool turns, the final reward, and every failure as an error
message plus a counter in Step.info (never an exception)."""

import math

import agent_tools as t
import pytest

from hone.agents.environment import Environment, Step, ToolEnvironment
from hone.agents.parsers import HermesParser, ToolCall
from hone.agents.tool_runner import ToolRunner
from hone.agents.tools import tool_schema

fmt = HermesParser().format
EXAMPLE = {"prompt": "What is 2 + 3?", "answer": "5"}


@pytest.fixture(scope="module")
def runner():
    with ToolRunner(max_workers=1) as r:
        yield r


def exact(example, messages, reply):
    return 1.0 if reply.strip() == example["answer"] else 0.0


def make(runner="inline", **kw):
    env = ToolEnvironment([t.add, t.echo, t.broken, t.nothing, t.sleepy], kw.pop("reward", exact),
                          runner=runner, **kw)
    env.reset(EXAMPLE)
    return env


def test_reset_opening_messages():
    env = ToolEnvironment([t.add], exact, system_prompt="Be brief.", runner="inline")
    assert env.reset(EXAMPLE) == [{"role": "system", "content": "Be brief."},
                                  {"role": "user", "content": "What is 2 + 3?"}]
    record = {"messages": [{"role": "user", "content": "hi"},
                           {"role": "assistant", "content": "yo"},
                           {"role": "user", "content": "2 + 3?"}], "answer": "5"}
    env = ToolEnvironment([t.add], exact, runner="inline")
    assert env.reset(record) == record["messages"]
    assert env.tools == [tool_schema(t.add)]
    assert ToolEnvironment([], exact, runner="inline").tools is None


def test_tool_turn_then_final_answer_rewarded_with_the_conversation():
    seen = {}

    def reward(example, messages, reply):
        seen.update(example=example, messages=messages, reply=reply)
        return 1.0

    env = make(reward=reward, system_prompt="S")
    call = fmt([ToolCall("add", {"a": 2, "b": 3}), ToolCall("echo", {"text": "ok"})])
    step = env.step("thinking " + call)
    assert step == Step([{"role": "tool", "name": "add", "content": "5"},
                         {"role": "tool", "name": "echo", "content": "ok"}], 0.0, False,
                        {"tool_calls": 2})
    assert env.step("5") == Step([], 1.0, True, {})
    assert seen["example"] == EXAMPLE and seen["reply"] == "5"
    assert [m["role"] for m in seen["messages"]] == ["system", "user", "assistant", "tool", "tool",
                                                     "assistant"]
    assert seen["messages"][-1] == {"role": "assistant", "content": "5"}
    with pytest.raises(RuntimeError, match="after the episode ended"):
        env.step("again")


@pytest.mark.parametrize("call, content, event", [
    (ToolCall("nope", {}), "error: unknown tool 'nope'; tools: add, echo, broken, nothing, sleepy",
     "unknown_tools"),
    (ToolCall("add", {"b": 1}), "error: wrong arguments for 'add': missing a required argument: "
                                "'a'", "tool_errors"),
    (ToolCall("broken", {"x": 7}), "error: RuntimeError: broken on 7", "tool_errors"),
    (ToolCall("nothing", {}), "error: tool 'nothing' returned NoneType, not text (a bug in the "
                              "tool)", "tool_bad_results"),
])
def test_each_failure_is_a_message_and_a_counter(call, content, event):
    env = make()
    step = env.step(fmt([call]))
    assert step == Step([{"role": "tool", "name": call.name, "content": content}], 0.0, False,
                        {"tool_calls": 1, event: 1})
    assert env.step("5").reward == 1.0  # the episode goes on


def test_malformed_call_is_a_message_and_a_counter():
    env = make()
    step = env.step('<tool_call>{"name": "add", "arguments": [1]}</tool_call>')
    assert not step.done and step.info == {"tool_calls": 1, "malformed_calls": 1}
    [message] = step.messages
    assert message["role"] == "tool" and message["content"].startswith("error: malformed tool call")


def test_long_result_is_cut_and_marked():
    env = make(max_result_chars=10)
    step = env.step(fmt([ToolCall("echo", {"text": "x" * 25})]))
    assert step.messages[0]["content"] == "x" * 10 + "...[cut 15 characters]"
    assert step.info == {"tool_calls": 1, "tool_results_cut": 1}


def test_hung_tool_in_a_worker_times_out(runner):
    env = make(runner=runner, timeout_s=0.5)
    step = env.step(fmt([ToolCall("sleepy", {"seconds": 60}), ToolCall("add", {"a": 1})]))
    assert step.messages == [
        {"role": "tool", "name": "sleepy",
         "content": "error: tool 'sleepy' did not finish within 0.5 s and was stopped"},
        {"role": "tool", "name": "add", "content": "2"}]
    assert step.info == {"tool_calls": 2, "tool_timeouts": 1}


def test_process_runner_refuses_local_tools(runner):
    def local(x: int) -> int:
        """Doc."""
        return x

    with pytest.raises(TypeError, match="tool 'local' cannot be sent to a worker process"):
        ToolEnvironment([local], exact, runner=runner)
    with pytest.raises(ValueError, match="two tools share a name"):
        ToolEnvironment([t.add, t.add], exact, runner="inline")


def test_turn_limit_ends_the_episode_without_running_its_calls():
    env = make(max_turns=2)
    assert not env.step(fmt([ToolCall("add", {"a": 1})])).done
    assert env.step(fmt([ToolCall("broken", {"x": 1})])) == Step([], 0.0, True, {"turn_limits": 1})


def test_answer_at_the_turn_limit_is_rewarded():
    env = make(max_turns=1)
    assert env.step("5") == Step([], 1.0, True, {})


def raises(example, messages, reply):
    raise KeyError("answer")


@pytest.mark.parametrize("reward", [raises, lambda **kw: "1.0", lambda **kw: math.nan,
                                    lambda **kw: None])
def test_bad_reward_gives_the_fallback(reward):
    env = make(reward=reward, fallback_reward=-0.5)
    assert env.step("5") == Step([], -0.5, True, {"reward_errors": 1})
    assert env.reward_error


def test_seed_makes_the_rng_reproducible():
    a, b = Environment(), Environment()
    a.seed(3)
    b.seed(3)
    assert [a.rng.random() for _ in range(3)] == [b.rng.random() for _ in range(3)]
