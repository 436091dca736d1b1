"""hone.config.reference_doc: docs/configuration.md is current, complete, loadable, and pairs comments
with the right fields."""

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hone.config import COMMANDS, load_config
from hone.config import reference_doc as reference
from hone.config.fields import fields_of, is_section

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def _leaf_keys(cls, prefix=""):
    """Every dotted leaf key of a config class, walked independently of the generator."""
    out = []
    for name, (_, tp) in fields_of(cls).items():
        out += _leaf_keys(tp, f"{prefix}{name}.") if is_section(tp) else [prefix + name]
    return out


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


def test_the_checked_in_reference_is_current():
    assert DOC.exists(), "run python -m hone.config.reference_doc --write"
    assert DOC.read_text(encoding="utf-8") == reference.reference(), (
        "docs/configuration.md is stale: run python -m hone.config.reference_doc --write")


def test_every_field_of_every_command_is_documented():
    text = reference.reference()
    documented = reference.keys()
    for command, cls in COMMANDS.items():
        for key in _leaf_keys(cls):
            assert command in documented.get(key, {}), f"{key} of hone {command} is missing"
            assert f"| `{key}` |" in text, key
    # ... and nothing else: each documented key exists for the commands listed with it.
    for key, per_command in documented.items():
        for command in per_command:
            assert key in _leaf_keys(COMMANDS[command]), (key, command)
    for s in reference.sections():
        assert all(reference.field_comments(s.cls).values()), s.path
        if s.path:
            assert f"### `{s.path}`" in text


def test_every_documented_default_loads_back_as_an_override():
    # Every (key, command) pair: the default as written in the reference, given back as an
    # override, is accepted and yields that same default.
    documented = reference.keys()
    assert len(documented) > 100
    for key, per_command in documented.items():
        for command, text in per_command.items():
            cfg = load_config(COMMANDS[command], None, [f"{key}={text}"])
            assert _get(cfg, key) == _get(COMMANDS[command](), key), (command, key, text)


# --- comment pairing on hand-written dataclasses ------------------------------------------------

def _positive(value):
    """`check` rule: a positive number."""
    return None if value > 0 else "must be positive"


@dataclass(frozen=True)
class _Inner:
    # Inner knob.
    knob: int = field(default=1, metadata={"min": 0, "lt": 10})


@dataclass(frozen=True)
class _Hand:
    # One line.
    one: int = 1
    # First line,
    # second line.
    two: str = field(default="a # not a comment",
                     metadata={"choices": ("a # not a comment", "b")})

    # Blank line between this comment and the field: not its comment.

    three: float = 0.5  # a trailing comment is not a description either
    four: tuple[int, ...] = field(default=(), metadata={"min": 1})
    # Inside a section.
    inner: _Inner = field(default_factory=_Inner)
    # Needs a check.
    five: float = field(default=1.0, metadata={"check": _positive})


@dataclass(frozen=True)
class _Child(_Hand):
    # Redeclared with a new default.
    one: int = 2
    # Added by the child.
    six: bool | None = None


def test_comments_pair_with_the_field_below_them():
    assert reference.field_comments(_Hand) == {
        "one": "One line.", "two": "First line, second line.", "three": "", "four": "",
        "inner": "Inside a section.", "five": "Needs a check."}
    assert reference.field_comments(_Inner) == {"knob": "Inner knob."}


def test_an_inherited_field_keeps_the_comment_of_the_class_that_declares_it():
    comments = reference.field_comments(_Child)
    assert comments["one"] == "Redeclared with a new default."
    assert comments["two"] == "First line, second line."
    assert comments["six"] == "Added by the child."


def test_an_uncommented_field_fails_the_generator(monkeypatch):
    monkeypatch.setattr(reference, "COMMANDS", {"hand": _Hand})
    with pytest.raises(ValueError, match=r"_Hand.three \(three\) has no comment"):
        reference.reference()


def test_rules_types_and_defaults_are_rendered(monkeypatch):
    @dataclass(frozen=True)
    class Root:
        # Documented.
        inner: _Inner = field(default_factory=_Inner)
        # A check rule.
        five: float = field(default=1.0, metadata={"check": _positive})
        # A list rule.
        four: tuple[int, ...] = field(default=(), metadata={"min": 1})
        # An optional value.
        six: bool | None = None

    monkeypatch.setattr(reference, "COMMANDS", {"hand": Root})
    text = reference.reference()
    assert "| `inner.knob` | int | `1` | >= 0; < 10 | Inner knob. |" in text
    assert "| `five` | float | `1.0` | a positive number | A check rule. |" in text
    assert "| `four` | list of int | `[]` | each item >= 1 | A list rule. |" in text
    assert "| `six` | bool or null | `null` |  | An optional value. |" in text
