"""tool_schema by hand-checked schemas, describe_tools' call format, run_tool's outcomes, and
ToolRunner's worker processes: results, timeouts that kill and replace, crashes, no leaks."""

import json
import multiprocessing
import os
import time
from typing import Literal, Optional

import agent_tools as t
import pytest

from hone.agents.calculator import calculator
from hone.agents.tool_runner import InlineRunner, ToolRunner
from hone.agents.tools import describe_tools, run_tool, tool_schema


@pytest.fixture(scope="module")
def runner():
    with ToolRunner(max_workers=2) as r:
        yield r


def search(query: str, limit: int, scale: float, exact: bool, tags: list[str], extra: dict,
           after: Optional[int], mode: Literal["fast", "slow"] = "fast",
           lang: str | None = None) -> str:
    """Search the notes
    for a query.

    Longer text that is not part of the description.

    Args:
        query: What to look for,
            over two lines.
        limit (int): At most this many.
        scale: A factor.
        exact: Whole words only.
        tags: Only notes with these tags.
        extra: Anything else.
        after: Only notes after this day.
        mode: How hard to look.

    Returns:
        lang: not a parameter (a Returns section).
    """
    return ""


def test_schema_by_hand():
    assert tool_schema(search) == {"type": "function", "function": {
        "name": "search",
        "description": "Search the notes for a query.",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string", "description": "What to look for, over two lines."},
            "limit": {"type": "integer", "description": "At most this many."},
            "scale": {"type": "number", "description": "A factor."},
            "exact": {"type": "boolean", "description": "Whole words only."},
            "tags": {"type": "array", "items": {"type": "string"},
                     "description": "Only notes with these tags."},
            "extra": {"type": "object", "description": "Anything else."},
            "after": {"type": ["integer", "null"], "description": "Only notes after this day."},
            "mode": {"type": "string", "enum": ["fast", "slow"],
                     "description": "How hard to look."},
            "lang": {"type": ["string", "null"]},
        }, "required": ["query", "limit", "scale", "exact", "tags", "extra", "after"]}}}


def test_calculator_schema():
    assert tool_schema(calculator)["function"]["parameters"] == {
        "type": "object", "required": ["expression"], "properties": {"expression": {
            "type": "string", "description": 'The expression to evaluate, for example "4821 * 367" '
                                             'or "(12.5 + 3) / 4".'}}}


def no_doc(x: int) -> str:
    return ""


def no_hint(x) -> str:
    """Doc."""


def star(*xs: int) -> str:
    """Doc."""


def odd(x: tuple[int, int]) -> str:
    """Doc."""


@pytest.mark.parametrize("fn, says", [
    (no_doc, "tool 'no_doc' has no docstring"),
    (no_hint, "tool 'no_hint': parameter 'x' has no type hint"),
    (star, "tool 'star': parameter 'xs' must be an ordinary keyword parameter"),
    (odd, "tool 'odd', parameter 'x': unsupported type hint"),
])
def test_schema_errors_name_the_function(fn, says):
    with pytest.raises(TypeError) as err:
        tool_schema(fn)
    assert says in str(err.value)


def test_describe_tools_lists_each_tool_and_the_call_format():
    schemas = [tool_schema(calculator), tool_schema(t.add)]
    text = describe_tools(schemas)
    for s in schemas:
        f = s["function"]
        assert f"- {f['name']}: {f['description']}" in text
        assert json.dumps(f["parameters"], ensure_ascii=False) in text
    # the example block is the parser's layout (its JSON is a placeholder, so only the frame)
    assert '<tool_call>\n{"name": "TOOL_NAME", "arguments": {' in text
    assert text.count("<tool_call>") == text.count("</tool_call>") == 1


@pytest.mark.parametrize("fn, args, expected", [
    (t.echo, {"text": "hi"}, (True, "hi", None)),
    (t.add, {"a": 2}, (True, "3", None)),  # an int is written as JSON
    (t.echo, {"text": 2.5}, (True, "2.5", None)),
    (t.echo, {"text": True}, (True, "true", None)),
    (t.echo, {"text": float("nan")}, (False, "error: tool 'echo' returned float, not text (a "
                                             "bug in the tool)", "tool_bad_results")),
    (t.echo, {"text": [1]}, (False, "error: tool 'echo' returned list, not text (a bug in the "
                                    "tool)", "tool_bad_results")),
    (t.nothing, {}, (False, "error: tool 'nothing' returned NoneType, not text (a bug in the "
                            "tool)", "tool_bad_results")),
    (t.broken, {"x": 1}, (False, "error: RuntimeError: broken on 1", "tool_errors")),
    (t.add, {"a": 1, "c": 2}, (False, "error: wrong arguments for 'add': got an unexpected "
                                      "keyword argument 'c'", "tool_errors")),
])
def test_run_tool_outcomes_inline_and_in_a_worker(runner, fn, args, expected):
    assert run_tool(fn, args) == expected
    assert InlineRunner().call(fn, args) == expected
    assert runner.call(fn, args, 5.0) == expected


def test_calculator_runs_in_a_worker(runner):
    assert runner.call(calculator, {"expression": "4821 * 367"}, 5.0) == (True, "1769307", None)


def test_worker_runs_in_another_process_and_is_reused(runner):
    first = runner.call(t.pid, {}, 5.0)
    assert first[0] and int(first[1]) != os.getpid()
    assert runner.call(t.pid, {}, 5.0) == first  # the same worker serves the next call


def test_hung_tool_times_out_and_its_worker_is_killed_and_replaced(runner):
    _, before, _ = runner.call(t.pid, {}, 5.0)
    start = time.monotonic()
    ok, text, event = runner.call(t.sleepy, {"seconds": 60}, 0.5)
    waited = time.monotonic() - start
    assert (ok, event) == (False, "tool_timeouts")
    assert text == "error: tool 'sleepy' did not finish within 0.5 s and was stopped"
    assert 0.5 <= waited < 30  # it came back long before the tool would have
    with pytest.raises(ProcessLookupError):
        os.kill(int(before), 0)  # killed and reaped
    ok, after, _ = runner.call(t.pid, {}, 5.0)
    assert ok and after != before


def test_crashed_worker_is_an_error_and_replaced(runner):
    assert runner.call(t.crash, {}, 5.0) == (
        False, "error: tool 'crash' crashed its worker process (exit code 3)", "tool_errors")
    assert runner.call(t.add, {"a": 1}, 5.0) == (True, "2", None)


def test_no_process_leaks_after_many_timeouts():
    before = set(multiprocessing.active_children())
    with ToolRunner(max_workers=2) as r:
        for _ in range(4):
            assert r.call(t.sleepy, {"seconds": 60}, 0.2)[2] == "tool_timeouts"
            assert len(set(multiprocessing.active_children()) - before) <= 2
        assert r.call(t.add, {"a": 1}, 5.0) == (True, "2", None)
    assert set(multiprocessing.active_children()) - before == set()
    with pytest.raises(RuntimeError, match="closed"):
        r.call(t.add, {"a": 1}, 5.0)


def test_local_functions_are_refused_before_any_call(runner):
    def local(x: int) -> int:
        """Doc."""
        return x

    with pytest.raises(TypeError, match="define it at module level, or use runner='inline'"):
        runner.check(local)
    runner.check(t.add)
    InlineRunner().check(local)


def test_a_slow_import_is_not_timed_as_the_call():
    import slow_import_tools as slow
    with ToolRunner(max_workers=1) as r:
        start = time.monotonic()
        ok, pid, event = r.call(slow.worker_pid, {}, 0.5)  # the worker imports for 1.5 s first
        assert (ok, event) == (True, None) and time.monotonic() - start >= slow.IMPORT_S
        assert r.call(slow.worker_pid, {}, 0.5) == (True, pid, None)  # imported once
    with ToolRunner(max_workers=1, load_timeout_s=0.5) as r:
        assert r.call(slow.worker_pid, {}, 5.0) == (
            False, "error: the worker could not import 'worker_pid''s module "
            "'slow_import_tools' within 0.5 s", "tool_timeouts")
        assert r.call(t.add, {"a": 1}, 5.0) == (True, "2", None)  # a fresh worker serves on
