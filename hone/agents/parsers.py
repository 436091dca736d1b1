"""Tool-call parsers: the model's decoded turn -> the tool calls it asks for.

A parser is any object with `parse(reply) -> (calls, malformed)`; `HermesParser` reads the
Hermes/Qwen format, which is also what hone writes (SFT traces, the tool description of
`describe_tools`) for chat templates without tool support:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "4821 * 367"}}
    </tool_call>

Design choices:

- Never raises on model output: a block that is not a call (bad JSON, no name, arguments that are
  not an object) is counted in `malformed`, so the environment can tell the model what went wrong
  and the run can count it. An opening tag that is never closed (a turn cut at the token limit)
  counts as one malformed call.
- Each block's JSON is decoded from its opening tag with `raw_decode`, not cut at the first
  closing tag, so an argument that itself contains "</tool_call>" survives:
  `parse(format(calls)) == (calls, 0)` for every JSON-representable call (property-tested).
- `arguments` may arrive as a JSON string holding an object (some models double-encode it);
  a call without `arguments` is a call without arguments ({}).
- `Llama3JsonParser` ("llama3") reads the JSON object Llama 3.1-3.3's templates ask for, the
  whole reply: {"name": ..., "parameters": {...}}.
- Config names a parser by `agent.parser`: "hermes", "llama3", or "package.module:Name" (a
  class, called without arguments, or an object with parse()).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from hone.errors import InputError

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_SPACE = re.compile(r"\s*")


@dataclass(frozen=True)
class ToolCall:
    """One call the model asked for: the tool's `name` and its keyword `arguments`."""
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


def _call_from_json(obj: Any) -> ToolCall | None:
    """The ToolCall a decoded block describes, or None when it is not a well-formed call."""
    if not isinstance(obj, dict):
        return None
    name, arguments = obj.get("name"), obj.get("arguments", {})
    if isinstance(arguments, str):  # double-encoded: '{"arguments": "{\"x\": 1}"}'
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        return None
    return ToolCall(name, arguments)


class HermesParser:
    """Zero or more `<tool_call>{json}</tool_call>` blocks anywhere in a reply."""

    def parse(self, reply: str) -> tuple[list[ToolCall], int]:
        """(the well-formed calls in order, the number of malformed blocks)."""
        calls: list[ToolCall] = []
        malformed = 0
        decoder = json.JSONDecoder()
        start = reply.find(OPEN)
        while start >= 0:
            at = _SPACE.match(reply, start + len(OPEN)).end()
            call, end = None, -1
            try:
                obj, after = decoder.raw_decode(reply, at)
                after = _SPACE.match(reply, after).end()
                if reply.startswith(CLOSE, after):
                    call, end = _call_from_json(obj), after + len(CLOSE)
            except (ValueError, RecursionError):  # RecursionError: absurdly deep nesting
                pass
            if end < 0:  # not one JSON value then the closing tag: resume after the closing
                close = reply.find(CLOSE, at)  # tag, or at the next opening one if it comes first
                again = reply.find(OPEN, at)
                if again >= 0 and (close < 0 or again < close):
                    end = again
                else:
                    end = len(reply) if close < 0 else close + len(CLOSE)
            if call is None:
                malformed += 1
            else:
                calls.append(call)
            start = reply.find(OPEN, end)
        return calls, malformed

    def format(self, calls: list[ToolCall]) -> str:
        """The text of `calls` in the format `parse` reads, one block per call joined by "\\n"."""
        return "\n".join(
            OPEN + "\n" + json.dumps({"name": c.name, "arguments": c.arguments},
                                     ensure_ascii=False) + "\n" + CLOSE
            for c in calls)


PYTHON_TAG = "<|python_tag|>"
_SEPARATOR = re.compile(r"\s*;?\s*")


class Llama3JsonParser:
    """Llama 3.1-3.3's JSON tool calls, the format their chat templates ask for: the reply is
    a JSON object {"name": ..., "parameters": {...}} (optionally after "<|python_tag|>"),
    several separated by ";". A reply that does not start with "{" calls nothing (it is the
    answer); text after the last object is not read. An object that does not decode, or is not
    a call, is counted malformed and ends the reading. "arguments" is read where "parameters"
    is missing."""

    def parse(self, reply: str) -> tuple[list[ToolCall], int]:
        text = reply.strip()
        if text.startswith(PYTHON_TAG):
            text = text[len(PYTHON_TAG):].lstrip()
        calls: list[ToolCall] = []
        decoder, at = json.JSONDecoder(), 0
        while text.startswith("{", at):
            try:
                obj, at = decoder.raw_decode(text, at)
            except (ValueError, RecursionError):
                return calls, 1
            if isinstance(obj, dict) and "parameters" in obj:
                obj = {"name": obj.get("name"), "arguments": obj["parameters"]}
            call = _call_from_json(obj)
            if call is None:
                return calls, 1
            calls.append(call)
            at = _SEPARATOR.match(text, at).end()
        return calls, 0

    def format(self, calls: list[ToolCall]) -> str:
        """The text of `calls` in the format `parse` reads: the objects joined by "; "."""
        return "; ".join(json.dumps({"name": c.name, "parameters": c.arguments},
                                    ensure_ascii=False) for c in calls)


PARSERS = {"hermes": HermesParser, "llama3": Llama3JsonParser}


def parser_from_name(name: str, key: str = "agent.parser"):
    """The parser config names: a key of PARSERS, or "package.module:Name" (a class, called
    without arguments, or an object with a parse method). Errors are InputErrors naming `key`."""
    if name in PARSERS:
        return PARSERS[name]()
    if ":" not in name:
        raise InputError(f"unknown parser {name!r}; built-in: {', '.join(PARSERS)}, or a class "
                         "'package.module:Name'", key=key)
    from hone.plugins import load_function
    obj = load_function(name, key=key)
    if isinstance(obj, type):
        obj = obj()
    if not callable(getattr(obj, "parse", None)):
        raise InputError(f"{name!r} has no parse(reply) method", key=key)
    return obj
