"""Loading a config: a YAML file plus dotted overrides -> nested frozen dataclasses.

This file owns `load_config`: reading the file, applying `key.sub=value` overrides from the command
line, building the dataclasses section by section, and saying in every error where the bad value
came from (the file, or the override that set it). It knows no schema; `hone.config.schema`
declares the sections, `hone.config.fields` checks each value and `hone.config.yaml_io` reads and
writes the YAML. Design choices:

- Every field has a default, so an empty file is a valid config. An unknown key is an error naming
  the dotted key, where it came from (file or override), the keys allowed there and a near match.
- Override values are parsed as YAML, except for string fields, which take the text as written:
  paths and regexes such as `.*/attn/[qv]` or `runs/a #2` would otherwise turn into lists, or lose
  a "comment". Quote the text to have it parsed as YAML; `null` clears an optional string field.
- A rule between fields (the top-level `__post_init__`) raises InputError with the key only; the
  loader adds the file and the overrides involved.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, Mapping, TypeVar

import yaml

from hone.config.fields import (Problem, check_rules, convert, fields_of, is_section, show,
                                unknown_key, unwrap_optional)
from hone.config.yaml_io import parse_yaml, read_yaml
from hone.errors import InputError

T = TypeVar("T")


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
        fields = fields_of(cls)
        if part not in fields:
            raise InputError(unknown_key(root, cls, prefix, part)
                             + f" (in the override '{text}')", key=prefix + part)
        tp = fields[part][1]
        cls = tp if is_section(tp) else None
    if cls is not None:
        first = next(iter(fields_of(cls)), "KEY")
        raise InputError(f"names a section, not a value; set its keys one at a time, e.g. "
                         f"{key}.{first}=... (in the override '{text}')", key=key)

    inner, optional = unwrap_optional(tp)
    if inner is str:
        if optional and raw.strip() in _NULL_WORDS:
            return parts, None
        if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
            try:
                quoted = parse_yaml(raw)
            except yaml.YAMLError:
                quoted = None
            if isinstance(quoted, str):
                return parts, quoted
        return parts, raw
    try:
        return parts, parse_yaml(raw)
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
            raise InputError(f"expected a section (indented key: value lines), got {show(child)}",
                             path=path, key=".".join(parts[: i + 1]))
        node[part] = node = dict(child)
    node[parts[-1]] = value


def _build(root: type, cls: type, raw: Mapping, prefix: str, origins: _Origins,
           base: Any = None) -> Any:
    """An instance of `cls` from `raw`; keys not in `raw` keep the defaults: `base`'s values
    when given (a section whose field default is an instance built by a factory, such as the
    RL commands' own `data:` defaults), else the class's."""
    fields = fields_of(cls)
    for name in raw:
        if name not in fields:
            name = name if isinstance(name, str) else show(name)  # str() fails on huge ints
            raise origins.error(unknown_key(root, cls, prefix, name), prefix + name)
    kwargs = {}
    for name, (f, tp) in fields.items():
        if name not in raw:
            continue  # the field's default
        key, value = prefix + name, raw[name]
        if is_section(tp):
            if value is None:  # "lora:" with nothing under it
                value = {}
            if not isinstance(value, Mapping):
                raise origins.error(f"expected a section (indented key: value lines), "
                                    f"got {show(value)}", key)
            default = (f.default_factory() if f.default_factory is not dataclasses.MISSING
                       else None)
            kwargs[name] = _build(root, tp, value, key + ".", origins,
                                  default if isinstance(default, tp) else None)
            continue
        try:
            kwargs[name] = convert(tp, value)
            check_rules(kwargs[name], f.metadata)
        except Problem as p:
            raise origins.error(str(p), key) from None
    if prefix:
        return cls(**kwargs) if base is None else dataclasses.replace(base, **kwargs)
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
    if not is_section(cls):
        raise TypeError(f"load_config needs a dataclass type, got {cls!r}")
    if isinstance(overrides, str):
        raise TypeError("overrides is a list of 'key=value' strings, not one string")
    where = None if path is None else os.fspath(path)
    raw = {} if where is None else read_yaml(where)
    if raw is None:  # an empty file
        raw = {}
    if not isinstance(raw, dict):
        raise InputError(f"expected sections (key: value lines) at the top level, "
                         f"got {show(raw)}", path=where)
    origins = _Origins(where)
    for text in overrides:
        parts, value = _parse_override(cls, text)
        _set(raw, parts, value, where)
        origins.overrides[".".join(parts)] = text
    return _build(cls, cls, raw, "", origins)
