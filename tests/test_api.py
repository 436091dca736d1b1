"""Every name docs/api.md promises imports from where the page says it lives.

The page is read, not a list kept beside it: each `hone.a.b` written in it, each
`from hone.x import a, b` of its code blocks, each function of the `hone.losses` table, each
`hone.eval` function it names, and the agents' names, must resolve. How they behave is held by
the tests of each module (losses against hand-computed numbers, models against transformers).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

API = Path(__file__).resolve().parents[1] / "docs" / "api.md"
TEXT = API.read_text()


def resolve(dotted: str):
    """hone.a.b.c -> the object: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ModuleNotFoundError(dotted)


def section(title: str) -> str:
    found = re.search(rf"^#+ {re.escape(title)}.*?(?=^#+ |\Z)", TEXT, re.S | re.M)
    assert found, f"docs/api.md has no section {title!r}"
    return found.group(0)


def dotted_names() -> list[str]:
    # `hone.x` in prose and code; file paths (hone/...) and commands (`hone sft`) do not match.
    names = set(re.findall(r"(?<![\w/.])(hone(?:\.[A-Za-z_][A-Za-z0-9_]*)+)", TEXT))
    return sorted(n.rstrip(".") for n in names)


def from_imports() -> list[tuple[str, str]]:
    pairs = []
    for module, names in re.findall(r"^\s*from (hone[\w.]*) import ([\w, ]+)$", TEXT, re.M):
        pairs += [(module, n.strip()) for n in names.split(",") if n.strip()]
    return pairs


def loss_functions() -> list[str]:
    return re.findall(r"^\| `(\w+)\(", section("`hone.losses`"), re.M)


def test_the_page_names_what_this_test_reads():
    # If the page changes shape, this test must not quietly check nothing.
    assert len(dotted_names()) >= 10 and len(from_imports()) >= 4 and len(loss_functions()) >= 20


@pytest.mark.parametrize("dotted", dotted_names())
def test_dotted_name_resolves(dotted):
    assert resolve(dotted) is not None


@pytest.mark.parametrize("module,name", from_imports())
def test_from_import_resolves(module, name):
    assert hasattr(importlib.import_module(module), name), f"from {module} import {name}"


@pytest.mark.parametrize("name", loss_functions())
def test_loss_function_is_in_hone_losses(name):
    import hone.losses
    assert callable(getattr(hone.losses, name))


def test_top_level_names_and_the_other_modules():
    import hone
    for name in hone.__all__:
        assert getattr(hone, name) is not None, name
    # Named in prose: the agents' further names, hone.eval's functions.
    import hone.agents
    import hone.eval
    for name in ("ToolEnvironment", "tool_schema", "HermesParser", "Episode"):
        assert getattr(hone.agents, name) is not None, name
    listed = re.search(r"`hone\.eval`: (.*?)\. The same", TEXT, re.S).group(1)
    for name in re.findall(r"`(\w+)`", listed):
        assert callable(getattr(hone.eval, name)), f"hone.eval.{name}"
