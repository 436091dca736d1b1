"""Config YAML in and out: the YAML dialect, reading a config file, writing a resolved config.

This file owns the text side of configs and knows no schema (`hone.config.fields` walks the
dataclasses, `hone.config.load` builds them). Design choices:

- YAML is read by a SafeLoader (never an unsafe one) restricted to the YAML 1.2 core scalars: `3e-4`
  is a float (PyYAML's YAML 1.1 rules read it as a string), only true/false are booleans (`yes`,
  `no`, `on`, `off` stay strings, so `sinks: [no]` cannot silently become False), and there are no
  dates, octal `012` or sexagesimal `1:30`. A key written twice in one mapping is an error, not a
  silent last-one-wins.
- The dump quotes every string that YAML 1.1 or 1.2 would read as something else, so the file loads
  back equal both here and in any other YAML reader.
- Hostile text fails as `yaml.YAMLError` (so as an InputError naming the file, line and column):
  an explicit tag on text that does not fit it (`!!int x`, `!!float ''`, on which PyYAML's own
  constructors raise ValueError, IndexError or KeyError), an integer of over 1,000 digits, and
  nesting deeper than Python's recursion limit. Tags that build Python objects
  (`!!python/object/apply:...`) are unknown to a SafeLoader and refused.
"""

from __future__ import annotations

import dataclasses
import os
import re
from pathlib import Path
from typing import Any

import yaml

from hone.config.fields import fields_of
from hone.errors import InputError

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

    def construct_object(self, node, deep=False):
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, TypeError, KeyError, IndexError, OverflowError) as e:
            text = f" {node.value!r}"[:60] if isinstance(node, yaml.ScalarNode) else ""
            raise yaml.constructor.ConstructorError(
                None, None, f"cannot read{text} as {node.tag} ({type(e).__name__}: {e})"[:300],
                node.start_mark) from None


_MAX_INT_DIGITS = 1000  # far beyond any config value; Python refuses to parse 4,300 or more


def _construct_int(loader, node) -> int:
    text = loader.construct_scalar(node)
    if len(text) > _MAX_INT_DIGITS:
        raise yaml.constructor.ConstructorError(
            None, None, f"an integer of {len(text)} digits is not a config value", node.start_mark)
    if text.startswith(("0o", "0x")):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text, 10)  # "012" is twelve, as YAML 1.2 says


_Loader.add_constructor(_INT, _construct_int)


class QuotingDumper(yaml.SafeDumper):
    """SafeDumper that quotes strings either YAML 1.1 or the core rules above would misread."""

    yaml_implicit_resolvers = _resolvers(keep_yaml11=True)


# Sections as indented blocks, lists on one line: `sinks: [console, jsonl]`.
QuotingDumper.add_representer(
    list, lambda dumper, data: dumper.represent_sequence("tag:yaml.org,2002:seq", data,
                                                         flow_style=True))


def parse_yaml(text: str) -> Any:
    """YAML text -> Python data under the rules above; raises yaml.YAMLError."""
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 -- _Loader is a SafeLoader subclass
    except RecursionError:  # PyYAML's parser and constructor recurse once per nesting level
        raise yaml.YAMLError("the YAML nests too deeply") from None


# ---------------------------------------------------------------------------------------------
# Reading.


def read_yaml(path: str) -> Any:
    """The parsed content of the config file `path`; InputError names the file (and line)."""
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
        return parse_yaml(text)
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


# ---------------------------------------------------------------------------------------------
# Writing.


def to_dict(cfg: Any) -> dict[str, Any]:
    """A config as plain nested dicts, tuples as lists (what YAML or JSON can hold)."""
    out = {}
    for name in fields_of(type(cfg)):
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
    text = yaml.dump(to_dict(cfg), Dumper=QuotingDumper, sort_keys=False, default_flow_style=False,
                     allow_unicode=True, width=100)
    if path is not None:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, target)
    return text
