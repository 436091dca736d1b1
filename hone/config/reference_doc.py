"""The configuration reference, docs/configuration.md, generated from the config dataclasses.

The schema is the one place where a key's type, default, rule and meaning are written (the meaning
as the `#` comment above each field), so the reference is derived from it rather than kept by
hand; tests/config/test_reference.py fails when the file is stale or a field has no comment.
`python -m hone.config.reference_doc` prints it, `--write` rewrites docs/configuration.md.
Design choices:

- A field's description is the block of comment lines directly above it (no blank line between)
  in the source of the class that declares it, found with `ast` for the fields and `tokenize` for
  the comments, so a `#` inside a string or a trailing comment is never taken for one.
- A section is a dotted path (`model.lora`) and its class; it is documented once, with the
  commands that accept it. Sections every command has come first, the others after.
- Defaults are those of each command's config, since a command may give a section other defaults
  (`data.path` of `hone dpo`); they are written by the dumper of run_dir/config.yaml, so a default
  pasted back as an override loads unchanged.
"""

from __future__ import annotations

import argparse
import ast
import collections
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
import typing
from pathlib import Path
from typing import Any

import yaml

from hone.config import COMMANDS
from hone.config.fields import fields_of, is_section, unwrap_optional
from hone.config.yaml_io import QuotingDumper

OUTPUT = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
_BOUNDS = {"min": ">=", "gt": ">", "max": "<=", "lt": "<"}  # lower bounds first


@functools.cache
def _declared_comments(cls: type) -> dict[str, str]:
    """name -> the comment block above each field declared in `cls`'s own body ("" if none)."""
    source = textwrap.dedent(inspect.getsource(cls))
    alone = {}  # line number -> text of a line that holds only a comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and not tok.line[:tok.start[1]].strip():
            alone[tok.start[0]] = tok.string.lstrip("#").strip()
    comments = {}
    for node in ast.parse(source).body[0].body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            row, lines = node.lineno - 1, []
            while row in alone:
                lines.insert(0, alone[row])
                row -= 1
            comments[node.target.id] = " ".join(line for line in lines if line)
    return comments


def field_comments(cls: type) -> dict[str, str]:
    """name -> description of every field of the dataclass `cls` ("" where it has no comment).

    An inherited field's comment is read from the class that declares it last in the MRO, so a
    subclass that redeclares a field (a new default) documents it anew.
    """
    out = {}
    for name in fields_of(cls):
        owner = next(c for c in cls.__mro__ if name in c.__dict__.get("__annotations__", {}))
        out[name] = _declared_comments(owner).get(name, "")
    return out


@dataclasses.dataclass
class Section:
    """One documented section: its dotted path ("" = top level), class and accepting commands."""

    path: str
    cls: type
    commands: list[str]
    about: dict[str, str]  # command -> the comment on the field that holds the section


def sections() -> list[Section]:
    """Every section of every command, in schema order; ValueError on a field without a comment."""
    found: dict[tuple, Section] = {}

    def walk(cls: type, path: str, command: str, about: str) -> None:
        # Each command has its own top-level class; those with the same top-level keys share them.
        # A section class that extends another at the same path (KTO's data section adds
        # from_pairs to DataSection) is documented with it: one table, its extra keys marked.
        root = [c for c in cls.__mro__ if dataclasses.is_dataclass(c)][-1]
        key = (path, root) if path else ("", tuple(
            n for n, (_, tp) in fields_of(cls).items() if not is_section(tp)))
        section = found.setdefault(key, Section(path, cls, [], {}))
        if issubclass(cls, section.cls):
            section.cls = cls  # the widest class: every key of the section
        section.commands.append(command)
        section.about[command] = about
        for name, text in field_comments(cls).items():
            if not text:
                raise ValueError(f"{cls.__qualname__}.{name} ({path + '.' if path else ''}{name}) "
                                 "has no comment above it: every config key is documented")
            tp = fields_of(cls)[name][1]
            if is_section(tp):
                walk(tp, f"{path}.{name}" if path else name, command, text)

    for command, cls in COMMANDS.items():
        walk(cls, "", command, "")
    everywhere = [s for s in found.values() if len(s.commands) == len(COMMANDS)]
    return everywhere + [s for s in found.values() if len(s.commands) < len(COMMANDS)]


def to_yaml(value: Any) -> str:
    """A value as run_dir/config.yaml writes it (and as an override may give it back)."""
    value = list(value) if isinstance(value, tuple) else value
    return yaml.dump(value, Dumper=QuotingDumper, width=10**6).removesuffix("\n...\n").strip()


def _get(cfg: Any, dotted: str) -> Any:
    for part in filter(None, dotted.split(".")):
        cfg = getattr(cfg, part)
    return cfg


def keys() -> dict[str, dict[str, str]]:
    """Every documented leaf key -> {command accepting it: its default there, as YAML}."""
    defaults = {command: cls() for command, cls in COMMANDS.items()}
    out = {}
    for s in sections():
        for name, (_, tp) in fields_of(s.cls).items():
            if not is_section(tp):
                key = f"{s.path}.{name}" if s.path else name
                out[key] = {c: to_yaml(_get(defaults[c], key)) for c in s.commands
                            if name in fields_of(type(_get(defaults[c], s.path)))}
    return out


def _type_name(tp: Any) -> str:
    inner, optional = unwrap_optional(tp)
    if typing.get_origin(inner) is tuple:
        name = f"list of {typing.get_args(inner)[0].__name__}"
    else:
        name = inner.__name__
    return f"{name} or null" if optional else name


def _rule(f: dataclasses.Field, tp: Any) -> str:
    """The field's metadata rules in words (each item's, for a list)."""
    rules = dict(f.metadata)
    unknown = set(rules) - {"choices", "check", *_BOUNDS}
    if unknown:
        raise ValueError(f"{f.name}: no wording for the metadata rule(s) {sorted(unknown)}")
    parts = []
    if "choices" in rules:
        parts.append("one of " + ", ".join(f"`{to_yaml(c)}`" for c in rules["choices"]))
    parts += [f"{words} {to_yaml(rules[name])}" for name, words in _BOUNDS.items() if name in rules]
    if "check" in rules:
        # check functions are documented as "`check` rule: what the value must be".
        doc = inspect.getdoc(rules["check"]) or rules["check"].__name__
        parts.append(doc.splitlines()[0].split(": ", 1)[-1].rstrip("."))
    each = typing.get_origin(unwrap_optional(tp)[0]) is tuple
    return ("each item " if each and parts else "") + "; ".join(parts)


def _by_value(per_command: dict[str, str]) -> list[tuple[str, list[str]]]:
    """{command: value} -> [(value, commands)], the value most commands share first."""
    groups = collections.defaultdict(list)
    for command, value in per_command.items():
        groups[value].append(command)
    return sorted(groups.items(), key=lambda item: -len(item[1]))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _table(s: Section, defaults: dict[str, dict[str, str]]) -> list[str]:
    rows = ["| Key | Type | Default | Rule | Description |", "|---|---|---|---|---|"]
    comments = field_comments(s.cls)
    for name, (f, tp) in fields_of(s.cls).items():
        if is_section(tp):
            continue
        key = f"{s.path}.{name}" if s.path else name
        (main, _), *others = _by_value(defaults[key])
        default = f"`{main}`" + "".join(f"; {', '.join(cs)}: `{v}`" for v, cs in others)
        rule = _rule(f, tp)
        if len(defaults[key]) < len(s.commands):  # a key of an extending class only
            only = "only " + ", ".join(f"`hone {c}`" for c in defaults[key])
            rule = f"{only}; {rule}" if rule else only
        rows.append("| " + " | ".join(_cell(text) for text in (
            f"`{key}`", _type_name(tp), default, rule, comments[name])) + " |")
    return rows


def _heading(s: Section, defaults: dict[str, dict[str, str]]) -> list[str]:
    lines = [f"### `{s.path}`" if s.path else "### Top level", ""]
    if len(s.commands) < len(COMMANDS):
        lines += ["Accepted by " + ", ".join(f"`hone {c}`" for c in s.commands) + ".", ""]
    about = _by_value(s.about)
    if len(about) == 1 and about[0][0]:
        lines += [about[0][0], ""]
    elif len(about) > 1:
        lines += [f"- {', '.join(f'`hone {c}`' for c in cs)}: {text}" for text, cs in about]
        lines.append("")
    subsections = [n for n, (_, tp) in fields_of(s.cls).items() if is_section(tp)]
    if subsections and s.path:
        lines += ["Subsections: " + ", ".join(f"`{s.path}.{n}`" for n in subsections) + ".", ""]
    return lines + _table(s, defaults) + [""]


def reference() -> str:
    """The whole reference as Markdown."""
    all_sections, defaults = sections(), keys()
    shared = [s for s in all_sections if len(s.commands) == len(COMMANDS)]
    lines = [
        "# Configuration reference", "",
        "<!-- Generated from hone/config/*schema.py by `python -m hone.config.reference_doc --write`;"
        " edit the schema's comments, not this file. -->", "",
        "A training command reads its config from a YAML file of sections, then applies dotted "
        "overrides in order: `hone <command> --config FILE [section.key=value ...]`. Every key has "
        "a default, so an empty file is a valid config; an unknown key or a bad value stops the "
        "run with exit code 2. A list is written `[a, b]`, a missing value `null`. Defaults are "
        "given as YAML; where a command's default differs, it follows after `;` with the "
        "commands it applies to.", "",
        "| Command | Config class | Sections beyond those of every command |", "|---|---|---|"]
    for command, cls in COMMANDS.items():
        own = [f"`{s.path}`" for s in all_sections if s not in shared and command in s.commands
               and "." not in s.path]
        lines.append(f"| `hone {command}` | `{cls.__name__}` | {', '.join(own) or '-'} |")
    lines += ["", "## Sections of every command", ""]
    for s in shared:
        lines += _heading(s, defaults)
    lines += ["## Sections of some commands", ""]
    for s in all_sections[len(shared):]:
        lines += _heading(s, defaults)
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"write {OUTPUT}")
    text = reference()
    if parser.parse_args(argv).write:
        OUTPUT.parent.mkdir(parents=True, exist_ok=True)
        OUTPUT.write_text(text, encoding="utf-8")
        print(f"wrote {OUTPUT} ({len(keys())} keys)")
    else:
        print(text, end="")


if __name__ == "__main__":
    main()
