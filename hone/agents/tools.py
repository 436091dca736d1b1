"""Tools for agents: a Python function's JSON schema, the text that describes tools to a model,
and `run_tool`, which runs one call and turns its outcome into text.

A tool is a plain module-level function with type hints and a Google-style docstring; the model
calls it with keyword arguments decoded from JSON. Design choices:

- `tool_schema` derives the OpenAI function schema from the hints and the docstring, so a tool is
  written once. A function without them is a TypeError naming it: the model would be calling a
  tool it cannot read about.
- `run_tool` turns every outcome into `(ok, text, event)`: never raises for a tool's fault. The
  result must be a string; int, float and bool results are written as JSON ("3", "2.5", "true")
  and count as fine; anything else (None, dict, list, ...) is an error, `tool_bad_results`.
- Where calls run (worker processes, or this one): hone.agents.tool_runner.
"""

from __future__ import annotations

import inspect
import json
import math
import re
import types
import typing
from typing import Any, Callable, Literal, Union

from hone.agents.tool_messages import tools_system_text as describe_tools  # noqa: F401 (re-export)

Result = tuple[bool, str, "str | None"]  # (ok, result or error text, event counter or None)

# ---- schemas ---------------------------------------------------------------------------------

_SIMPLE = {int: "integer", float: "number", str: "string", bool: "boolean"}
_SECTION = re.compile(r"^(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?):\s*$")


def _type_schema(hint: Any, where: str) -> dict:
    """The JSON schema of a type hint: int, float, str, bool, list[...], dict, Literal, X | None."""
    if hint in _SIMPLE:
        return {"type": _SIMPLE[hint]}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is list or origin is list:
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        return {"type": "object"}
    if origin is Literal:
        kinds = {_SIMPLE.get(type(a)) for a in args}
        return {**({"type": kinds.pop()} if len(kinds) == 1 and None not in kinds else {}),
                "enum": list(args)}
    if origin in (Union, types.UnionType) and type(None) in args and len(args) == 2:
        inner = _type_schema(next(a for a in args if a is not type(None)), where)
        if isinstance(inner.get("type"), str):
            return {**inner, "type": [inner["type"], "null"]}
        return {"anyOf": [inner, {"type": "null"}]}
    raise TypeError(f"{where}: unsupported type hint {hint!r}; use int, float, str, bool, "
                    "list[...], dict, Literal[...] or X | None")


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """(first paragraph as one line, {parameter: description} of a Google-style Args section)."""
    lines = doc.splitlines()
    first = []
    for line in lines:
        if not line.strip():
            break
        first.append(line.strip())
    described: dict[str, str] = {}
    in_args, current, indent = False, None, None
    for line in lines:
        header = _SECTION.match(line.strip()) if not line.startswith((" ", "\t")) else None
        if header:
            in_args, current = header.group(1) in ("Args", "Arguments", "Parameters"), None
            continue
        if not in_args or not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        entry = re.match(r"^\s*\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if entry and (indent is None or width <= indent):
            indent, current = width, entry.group(1)
            described[current] = entry.group(2).strip()
        elif current is not None:  # a continuation line of the current parameter
            described[current] = (described[current] + " " + line.strip()).strip()
    return " ".join(first), described


def tool_schema(fn: Callable) -> dict:
    """The OpenAI function schema of `fn`: {"type": "function", "function": {"name",
    "description", "parameters"}} from its type hints and docstring. Parameters with a default are
    not required. Raises TypeError naming `fn` when it lacks hints, a docstring, or uses *args."""
    name = getattr(fn, "__name__", repr(fn))
    doc = inspect.getdoc(fn)
    if not doc:
        raise TypeError(f"tool {name!r} has no docstring: its first paragraph is the description "
                        "the model reads")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as err:  # a hint naming what the module does not define
        raise TypeError(f"tool {name!r}: cannot resolve its type hints ({err})") from err
    description, described = _docstring_parts(doc)
    properties, required = {}, []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD, p.POSITIONAL_ONLY):
            raise TypeError(f"tool {name!r}: parameter {p.name!r} must be an ordinary keyword "
                            "parameter (no *args, **kwargs or positional-only)")
        if p.name not in hints:
            raise TypeError(f"tool {name!r}: parameter {p.name!r} has no type hint")
        prop = _type_schema(hints[p.name], f"tool {name!r}, parameter {p.name!r}")
        if p.name in described:
            prop["description"] = described[p.name]
        properties[p.name] = prop
        if p.default is p.empty:
            required.append(p.name)
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


# ---- running one call ------------------------------------------------------------------------

def result_text(name: str, value: Any) -> Result:
    """A tool's return value as message text: strings as they are, numbers and bools as JSON."""
    if isinstance(value, str):
        return True, value, None
    if isinstance(value, (bool, int)) or (isinstance(value, float) and math.isfinite(value)):
        return True, json.dumps(value), None
    return (False, f"error: tool {name!r} returned {type(value).__name__}, not text (a bug in "
            "the tool)", "tool_bad_results")


def run_tool(fn: Callable, arguments: dict) -> Result:
    """Call `fn(**arguments)` here; every failure becomes an error text and its event."""
    name = getattr(fn, "__name__", "tool")
    try:
        inspect.signature(fn).bind(**arguments)
    except TypeError as err:
        return False, f"error: wrong arguments for {name!r}: {err}", "tool_errors"
    try:
        value = fn(**arguments)
    except (Exception, SystemExit) as err:  # SystemExit: a tool that calls sys.exit()
        return False, f"error: {type(err).__name__}: {err}", "tool_errors"
    return result_text(name, value)
