"""Typed configuration: a YAML file plus dotted overrides -> nested frozen dataclasses, and back.

This file owns reading a config (a YAML file and `key.sub=value` overrides from the command line),
checking every key and value against a dataclass schema, and writing a resolved config as YAML. It
knows no schema; `hone.config.schema` declares the sections. Design choices:

- YAML is read by a SafeLoader (never an unsafe one) restricted to the YAML 1.2 core scalars: `3e-4`
  is a float (PyYAML's YAML 1.1 rules read it as a string), only true/false are booleans (`yes`,
  `no`, `on`, `off` stay strings, so `sinks: [no]` cannot silently become False), and there are no
  dates, octal `012` or sexagesimal `1:30`. A key written twice in one mapping is an error, not a
  silent last-one-wins.
- Every field has a default, so an empty file is a valid config. An unknown key is an error naming
  the dotted key, where it came from (file or override), the keys allowed there and a near match.
- Single-value rules live in field metadata so the schema stays declarative: `choices` (checked
  per item for tuples), `min`/`max` (inclusive), `gt`/`lt` (exclusive), and `check`, a function of
  the value returning an error message or None. Rules between fields belong in the top-level
  config's `__post_init__`, raising `InputError(key="dotted.key")`; the loader adds the location.
- Override values are parsed as YAML, except for string fields, which take the text as written:
  paths and regexes such as `.*/attn/[qv]` or `runs/a #2` would otherwise turn into lists, or lose
  a "comment". Quote the text to have it parsed as YAML; `null` clears an optional string field.
- The dump quotes every string that YAML 1.1 or 1.2 would read as something else, so the file loads
  back equal both here and in any other YAML reader.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import operator
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from hone.errors import InputError

T = TypeVar("T")

# ---------------------------------------------------------------------------------------------
# YAML with the 1.2 core scalar rules.

_NULL, _BOOL = "tag:yaml.org,2002:null", "tag:yaml.org,2002:bool"
_INT, _FLOAT = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float"
_MERGE = "tag:yaml.org,2002:merge"

# (tag, regex, first characters it can start with), in the order they are tried: int before float.
_CORE_SCALARS = [
    (_NULL, re.compile(r"^(?:~|null|Null|NULL|)$"), ["~", "n", "N", ""]),
    (_BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")),
    (_INT, re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"), list("-+0123456789")),
    (_FLOAT, re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"), list("-+.0123456789")),
]


def _resolvers(keep_yaml11: bool) -> dict:
    """A resolver table: the core scalars, after PyYAML's YAML 1.1 ones when `keep_yaml11`."""
    table = {}
    for first, entries in yaml.SafeLoader.yaml_implicit_resolvers.items():
        kept = [(tag, rx) for tag, rx in entries if keep_yaml11 or tag == _MERGE]
        if kept:
            table[first] = kept
    for tag, regex, firsts in _CORE_SCALARS:
        for first in firsts:
            table.setdefault(first, []).append((tag, regex))
    return table


class _Loader(yaml.SafeLoader):
    """SafeLoader reading YAML 1.2 core scalars and rejecting duplicate keys."""

    yaml_implicit_resolvers = _resolvers(keep_yaml11=False)

    def construct_mapping(self, node, deep=False):
        # Explicit keys only: a key repeated after a `<<` merge is a legitimate override.
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                duplicate = key in seen
            except TypeError:  # unhashable key: PyYAML's own check below reports it
                continue
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    "while reading a mapping", node.start_mark, f"duplicate key {key!r}",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _construct_int(loader, node) -> int:
    text = loader.construct_scalar(node)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)  # "012" is twelve, as YAML 1.2 says


_Loader.add_constructor(_INT, _construct_int)


class _Dumper(yaml.SafeDumper):
    """SafeDumper that quotes strings either YAML 1.1 or the core rules above would misread."""

    yaml_implicit_resolvers = _resolvers(keep_yaml11=True)


# Sections as indented blocks, lists on one line: `sinks: [console, jsonl]`.
_Dumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data,
                                                         flow_style=True))


def _parse_yaml(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 -- _Loader is a SafeLoader subclass


# ---------------------------------------------------------------------------------------------
# Schema introspection.


@functools.cache
def _fields(cls: type) -> dict[str, tuple[dataclasses.Field, Any]]:
    """name -> (field, resolved type) for the init fields of a dataclass, in declaration order."""
    hints = typing.get_type_hints(cls)
    return {f.name: (f, hints[f.name]) for f in dataclasses.fields(cls) if f.init}


def _is_section(tp: Any) -> bool:
    return isinstance(tp, type) and dataclasses.is_dataclass(tp)


def _unwrap_optional(tp: Any) -> tuple[Any, bool]:
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
    for name, (_, tp) in _fields(cls).items():
        keys += _all_keys(tp, f"{prefix}{name}.") if _is_section(tp) else [prefix + name]
    return keys


_NOUNS = {bool: ("true or false", "booleans"), int: ("an integer", "integers"),
          float: ("a number", "numbers"), str: ("a string", "strings")}


def _describe(tp: Any) -> str:
    inner, optional = _unwrap_optional(tp)
    if inner in _NOUNS:
        text = _NOUNS[inner][0]
    elif typing.get_origin(inner) is tuple:
        text = f"a list of {_NOUNS[typing.get_args(inner)[0]][1]}"
    else:
        text = f"a {inner.__name__}"
    return text + (" or null" if optional else "")


def _show(value: Any) -> str:
    """A value as the user wrote it in YAML terms."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return "a section (" + ", ".join(f"{k}: ..." for k in value) + ")"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return repr(value)


# ---------------------------------------------------------------------------------------------
# Values.


class _Problem(Exception):
    """A bad value; the caller knows the key and the location and turns it into InputError."""


def _convert(tp: Any, value: Any) -> Any:
    """Check `value` (from YAML) against the field type `tp`; ints widen to float, lists to tuples."""
    inner, optional = _unwrap_optional(tp)
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
            if not math.isfinite(value):
                raise _Problem(f"expected a finite number, got {value!r}")
            return float(value)
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
                    items.append(_convert(args[0], item))
                except _Problem as p:
                    raise _Problem(f"item {i + 1} of {_show(value)}: {p}") from None
            return tuple(items)
    else:
        raise TypeError(f"unsupported config field type {tp!r}")
    raise _Problem(f"expected {_describe(tp)}, got {_show(value)}")


_BOUNDS = (("min", operator.ge, ">="), ("max", operator.le, "<="),
           ("gt", operator.gt, ">"), ("lt", operator.lt, "<"))


def _check_rules(value: Any, rules: Mapping[str, Any]) -> None:
    """Apply a field's metadata rules to a converted value (None always passes)."""
    if value is None:
        return
    for item in value if isinstance(value, tuple) else (value,):
        choices = rules.get("choices")
        if choices is not None and item not in choices:
            raise _Problem(f"{_show(item)} is not allowed; choose one of: "
                           + ", ".join(str(c) for c in choices))
        for name, holds, words in _BOUNDS:
            if name in rules and not holds(item, rules[name]):
                raise _Problem(f"must be {words} {rules[name]}, got {_show(item)}")
    check = rules.get("check")
    message = check(value) if check is not None else None
    if message:
        raise _Problem(message)


def check_fields(cfg: Any, prefix: str = "") -> None:
    """Apply every field's metadata rules over a config tree; InputError names the dotted key.

    The loader checks each value as it reads it; top-level configs also call this from
    `__post_init__`, so a config built in Python is held to the same rules.
    """
    for name, (f, tp) in _fields(type(cfg)).items():
        value = getattr(cfg, name)
        if _is_section(tp):
            check_fields(value, f"{prefix}{name}.")
            continue
        try:
            _check_rules(value, f.metadata)
        except _Problem as p:
            raise InputError(str(p), key=prefix + name) from None


# ---------------------------------------------------------------------------------------------
# Loading.


@dataclasses.dataclass
class _Origins:
    """Where each value came from, for error messages: the file, or the override that set it."""

    path: str | None
    overrides: dict[str, str] = dataclasses.field(default_factory=dict)  # dotted key -> "k=v"

    def error(self, message: str, key: str) -> InputError:
        text = self.overrides.get(key)
        if text is not None:
            return InputError(f"{message} (from the override '{text}')", key=key)
        return InputError(message, path=self.path, key=key)


def _unknown_key(root: type, cls: type, prefix: str, name: str) -> str:
    """The message for an unknown key `name` inside the section `cls` at dotted `prefix`."""
    known = list(_fields(cls))
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


def _read_yaml(path: str) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("config file not found", path=path) from None
    except IsADirectoryError:
        raise InputError("is a folder; --config takes a YAML file", path=path) from None
    except UnicodeDecodeError as e:
        raise InputError(f"config file is not UTF-8 text (byte {e.start})", path=path) from None
    except OSError as e:
        raise InputError(f"cannot read the config file ({e.strerror})", path=path) from None
    try:
        return _parse_yaml(text)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        context = f" ({e.context}"
        if e.context_mark and e.problem_mark and e.context_mark.line != e.problem_mark.line:
            context += f" at line {e.context_mark.line + 1}"
        context = context + ")" if e.context else ""
        raise InputError(f"invalid YAML{at}: {e.problem}{context}", path=path) from None
    except yaml.YAMLError as e:
        raise InputError(f"invalid YAML: {e}", path=path) from None


_NULL_WORDS = ("", "~", "null", "Null", "NULL")


def _parse_override(root: type, text: str) -> tuple[list[str], Any]:
    """`"train.lr=3e-4"` -> (["train", "lr"], 0.0003), the key checked against the schema."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    parts = key.split(".")
    if not sep or not all(parts):
        raise InputError(f"an override must look like section.key=value, got '{text}'")
    cls, tp = root, None
    for i, part in enumerate(parts):
        prefix = ".".join(parts[:i]) + "." if i else ""
        if cls is None:
            raise InputError(f"'{prefix[:-1]}' is a value, not a section "
                             f"(in the override '{text}')", key=key)
        fields = _fields(cls)
        if part not in fields:
            raise InputError(_unknown_key(root, cls, prefix, part)
                             + f" (in the override '{text}')", key=prefix + part)
        tp = fields[part][1]
        cls = tp if _is_section(tp) else None
    if cls is not None:
        first = next(iter(_fields(cls)), "KEY")
        raise InputError(f"names a section, not a value; set its keys one at a time, e.g. "
                         f"{key}.{first}=... (in the override '{text}')", key=key)

    inner, optional = _unwrap_optional(tp)
    if inner is str:
        if optional and raw.strip() in _NULL_WORDS:
            return parts, None
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            try:
                quoted = _parse_yaml(raw)
            except yaml.YAMLError:
                quoted = None
            if isinstance(quoted, str):
                return parts, quoted
        return parts, raw
    try:
        return parts, _parse_yaml(raw)
    except yaml.YAMLError as e:
        problem = getattr(e, "problem", None) or str(e)
        raise InputError(f"cannot read the value as YAML: {problem} (in the override '{text}')",
                         key=key) from None


def _set(tree: dict, parts: list[str], value: Any, path: str | None) -> None:
    """tree[a][b][c] = value, creating sections; sections are copied (YAML aliases share them)."""
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = {}
        elif not isinstance(child, dict):
            raise InputError(f"expected a section (indented key: value lines), got {_show(child)}",
                             path=path, key=".".join(parts[: i + 1]))
        node[part] = node = dict(child)
    node[parts[-1]] = value


def _build(root: type, cls: type, raw: Mapping, prefix: str, origins: _Origins) -> Any:
    fields = _fields(cls)
    for name in raw:
        if name not in fields:
            key = prefix + str(name)
            raise origins.error(_unknown_key(root, cls, prefix, str(name)), key)
    kwargs = {}
    for name, (f, tp) in fields.items():
        if name not in raw:
            continue  # the field's default
        key, value = prefix + name, raw[name]
        if _is_section(tp):
            if value is None:  # "lora:" with nothing under it
                value = {}
            if not isinstance(value, Mapping):
                raise origins.error(f"expected a section (indented key: value lines), "
                                    f"got {_show(value)}", key)
            kwargs[name] = _build(root, tp, value, key + ".", origins)
            continue
        try:
            kwargs[name] = _convert(tp, value)
            _check_rules(kwargs[name], f.metadata)
        except _Problem as p:
            raise origins.error(str(p), key) from None
    if prefix:
        return cls(**kwargs)
    try:
        return cls(**kwargs)
    except InputError as e:
        # A rule between fields (the top-level __post_init__) knows the key but not the file.
        if e.path is not None or e.key is None:
            raise
        message = str(e).removeprefix(f"'{e.key}': ")
        involved = [text for key, text in origins.overrides.items()
                    if key == e.key or key in message]
        if involved:
            message += " (with the override " + ", ".join(f"'{t}'" for t in involved) + ")"
        raise InputError(message, path=origins.path, key=e.key) from None


def load_config(cls: type[T], path: str | os.PathLike | None = None,
                overrides: Iterable[str] = ()) -> T:
    """Read the YAML file `path` (None = all defaults), apply `key.sub=value` overrides in order,
    and build the frozen dataclass `cls`. Any bad key or value raises InputError naming it."""
    if not _is_section(cls):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    if isinstance(overrides, str):
        raise TypeError("overrides is a list of 'key=value' strings, not one string")
    where = None if path is None else os.fspath(path)
    raw = {} if where is None else _read_yaml(where)
    if raw is None:  # an empty file
        raw = {}
    if not isinstance(raw, dict):
        raise InputError(f"expected sections (key: value lines) at the top level, "
                         f"got {_show(raw)}", path=where)
    origins = _Origins(where)
    for text in overrides:
        parts, value = _parse_override(cls, text)
        _set(raw, parts, value, where)
        origins.overrides[".".join(parts)] = text
    return _build(cls, cls, raw, "", origins)


# ---------------------------------------------------------------------------------------------
# Writing.


def to_dict(cfg: Any) -> dict[str, Any]:
    """A config as plain nested dicts, tuples as lists (what YAML or JSON can hold)."""
    out = {}
    for name in _fields(type(cfg)):
        value = getattr(cfg, name)
        if dataclasses.is_dataclass(value):
            value = to_dict(value)
        elif isinstance(value, tuple):
            value = list(value)
        out[name] = value
    return out


def dump_yaml(cfg: Any, path: str | os.PathLike | None = None) -> str:
    """The resolved config as YAML text; also written (atomically) to `path` when given.

    `load_config(type(cfg), path)` gives back an equal config.
    """
    text = yaml.dump(to_dict(cfg), Dumper=_Dumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    return text
