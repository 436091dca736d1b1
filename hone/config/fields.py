"""Config fields: reading a dataclass schema, and checking one value against its field.

This file owns what a schema allows: the fields and resolved types of a config dataclass, the
conversion of a YAML value to a field's type, the single-value rules, and the wording of "bad
value" and "unknown key" messages. It knows no particular schema (`hone.config.schema` declares
the sections) and no file or override (`hone.config.load` adds where a value came from).
Design choices:

- Field types are `bool`, `int`, `float`, `str`, `tuple[X, ...]`, a nested dataclass (a section)
  and `X | None` of those; anything else is a TypeError, a bug in the schema rather than the input.
  Ints widen to float, lists become tuples, and a float must be finite.
- Single-value rules live in field metadata so the schema stays declarative: `choices` (checked
  per item for tuples), `min`/`max` (inclusive), `gt`/`lt` (exclusive), and `check`, a function of
  the value returning an error message or None. Rules between fields belong in the top-level
  config's `__post_init__`, raising `InputError(key="dotted.key")`; the loader adds the location.
- An unknown key's message lists the keys allowed there and a near match: the same name in another
  section, else a similar name in this one.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import itertools
import math
import operator
import types
import typing
from typing import Any, Mapping

from hone.errors import InputError

# ---------------------------------------------------------------------------------------------
# Schema introspection.


@functools.cache
def fields_of(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """name -> (field, resolved type) for the init fields of a dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def is_section(tp: Any) -> bool:
    """Whether a field type is a nested section (a dataclass type) rather than a value."""
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def unwrap_optional(tp: Any) -> tuple[Any, bool]:
    """`X | None` -> (X, True); anything else -> (tp, False)."""
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        rest = [a for a in args if a is not type(None)]
        if len(args) == 2 and len(rest) == 1:
            return rest[0], True
        raise TypeError(f"unsupported config field type {tp!r}: only `X | None` unions")
    return tp, False


def _all_keys(cls: type, prefix: str = "") -> list[str]:
    """Every dotted leaf key of a schema."""
    keys = []
    for name, (_, tp) in fields_of(cls).items():
        keys += _all_keys(tp, f"{prefix}{name}.") if is_section(tp) else [prefix + name]
    return keys


def unknown_key(root: type, cls: type, prefix: str, name: str) -> str:
    """The message for an unknown key `name` inside the section `cls` at dotted `prefix`."""
    known = list(fields_of(cls))
    # Right name, wrong section ("train.max_length")? Else a similar name here, preferring one
    # that shares the first two letters ("lrate" -> "lr", not "remat").
    near = [k for k in _all_keys(root) if k.rsplit(".", 1)[-1] == name]
    if not near:
        similar = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
        similar = [k for k in similar if k[:2] == name[:2]] or similar[:1]
        near = [prefix + k for k in similar]
    hint = f" Did you mean '{near[0]}'?" if near else ""
    level = f"in '{prefix[:-1]}'" if prefix else "at the top level"
    return f"unknown key.{hint} Keys allowed {level}: {', '.join(known)}."


_NOUNS = {bool: ("true or false", "booleans"), int: ("an integer", "integers"),
          float: ("a number", "numbers"), str: ("a string", "strings")}


def _describe(tp: Any) -> str:
    inner, optional = unwrap_optional(tp)
    if inner in _NOUNS:
        text = _NOUNS[inner][0]
    elif typing.get_origin(inner) is tuple:
        text = f"a list of {_NOUNS[typing.get_args(inner)[0]][1]}"
    else:
        text = f"a {inner.__name__}"
    return text + (" or null" if optional else "")


# How much of a value an error message shows. YAML aliases make values that are small in the
# file huge once read (a "billion laughs" list expands to 9**9 items) or infinite (`&a [*a]`).
_SHOW_ITEMS, _SHOW_DEPTH, _SHOW_CHARS = 8, 3, 200


def show(value: Any, _depth: int = 0) -> str:
    """A value as the user wrote it in YAML terms, cut short (a few items, levels, characters)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        keys = [k if isinstance(k, str) else show(k, _SHOW_DEPTH) for k in
                itertools.islice(value, _SHOW_ITEMS)]
        more = ", ..." if len(value) > _SHOW_ITEMS else ""
        return _cut("a section (" + ", ".join(f"{k}: ..." for k in keys) + more + ")")
    if isinstance(value, (list, tuple)):
        if _depth >= _SHOW_DEPTH:
            return "[...]"
        items = [show(v, _depth + 1) for v in value[:_SHOW_ITEMS]]
        return _cut("[" + ", ".join(items + ["..."] * (len(value) > _SHOW_ITEMS)) + "]")
    if isinstance(value, int) and value.bit_length() > 256:  # repr fails past 4,300 digits
        return f"an integer of about {int(value.bit_length() * math.log10(2))} digits"
    return _cut(repr(value))


def _cut(text: str) -> str:
    return text if len(text) <= _SHOW_CHARS else text[:_SHOW_CHARS - 3] + "..."


# ---------------------------------------------------------------------------------------------
# Values.


class Problem(Exception):
    """A bad value; the caller knows the key and the location and turns it into InputError."""


def convert(tp: Any, value: Any) -> Any:
    """Check `value` (from YAML) against the field type `tp`; ints widen to float, lists to tuples."""
    inner, optional = unwrap_optional(tp)
    if value is None:
        if optional:
            return None
    elif inner is bool:
        if isinstance(value, bool):
            return value
    elif inner is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif inner is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            try:
                number = float(value)
            except OverflowError:  # an integer beyond float's range
                number = math.inf
            if not math.isfinite(number):
                raise Problem(f"expected a finite number, got {show(value)}")
            return number
    elif inner is str:
        if isinstance(value, str):
            return value
    elif typing.get_origin(inner) is tuple:
        args = typing.get_args(inner)
        if len(args) != 2 or args[1] is not Ellipsis:
            raise TypeError(f"unsupported config field type {tp!r}: only tuple[X, ...]")
        if isinstance(value, (list, tuple)):
            items = []
            for i, item in enumerate(value):
                try:
                    items.append(convert(args[0], item))
                except Problem as p:
                    raise Problem(f"item {i + 1} of {show(value)}: {p}") from None
            return tuple(items)
    else:
        raise TypeError(f"unsupported config field type {tp!r}")
    raise Problem(f"expected {_describe(tp)}, got {show(value)}")


_BOUNDS = (("min", operator.ge, ">="), ("max", operator.le, "<="),
           ("gt", operator.gt, ">"), ("lt", operator.lt, "<"))


def check_rules(value: Any, rules: Mapping[str, Any]) -> None:
    """Apply a field's metadata rules to a converted value (None always passes)."""
    if value is None:
        return
    for item in value if isinstance(value, tuple) else (value,):
        choices = rules.get("choices")
        if choices is not None and item not in choices:
            raise Problem(f"{show(item)} is not allowed; choose one of: "
                          + ", ".join(str(c) for c in choices))
        for name, holds, words in _BOUNDS:
            if name in rules and not holds(item, rules[name]):
                raise Problem(f"must be {words} {rules[name]}, got {show(item)}")
    check = rules.get("check")
    message = check(value) if check is not None else None
    if message:
        raise Problem(message)


def check_fields(cfg: Any, prefix: str = "") -> None:
    """Apply every field's metadata rules over a config tree; InputError names the dotted key.

    The loader checks each value as it reads it; top-level configs also call this from
    `__post_init__`, so a config built in Python is held to the same rules.
    """
    for name, (f, tp) in fields_of(type(cfg)).items():
        value = getattr(cfg, name)
        if is_section(tp):
            check_fields(value, f"{prefix}{name}.")
            continue
        try:
            check_rules(value, f.metadata)
        except Problem as p:
            raise InputError(str(p), key=prefix + name) from None
