"""Hostile configs: `load_config` of every command's schema, from a YAML file and `key=value`
overrides, either builds the config or raises InputError naming the file or the override.

The YAML is a valid config with values replaced by text a loader must survive: PyYAML tags that
would run code under an unsafe loader (`!!python/object/apply:os.system`), other tags (`!!binary`,
`!!set`, timestamps), anchors that refer to themselves or expand a billion times ("billion
laughs"), nesting 600 deep (past the recursion limit), 5,000-digit integers, infinities,
duplicate keys, merges of non-mappings, non-UTF-8 bytes and control characters; the overrides
get the same values, and keys that are not in the schema, name a section, or have no `=`.
"""

from __future__ import annotations

import yaml
from hypothesis import given
from hypothesis import strategies as st

from fuzz_common import EXAMPLES, FUZZ, Scratch, clear_or_ok
from hone.config import COMMANDS, load_config, to_dict

SCRATCH = Scratch("config")
SCHEMAS = {name: to_dict(cls()) for name, cls in COMMANDS.items()}


def _laughs(levels: int) -> str:
    """A flow list that expands to 9**levels strings through aliases (tiny as text)."""
    text = '["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]'
    for k in range(levels):
        text = f"[&l{k} {text}" + f", *l{k}" * 8 + "]"
    return text


HOSTILE_YAML = [
    "!!python/object/apply:os.system ['echo pwned']", "!!python/name:os.system",
    "!!python/object/new:tuple [[1]]", "!!binary aGVsbG8=", "!!set {a, b}", "!!omap [a: 1]",
    "!!timestamp 2001-12-14", "2001-12-14", "!!str", "!!int x", "!!float ''", "!!bool maybe",
    "&a [*a]", "&b {x: *b}", "*nowhere", _laughs(9), "[" * 600, "{a: " * 600,
    "9" * 5_000, "-" + "9" * 5_000, "0x" + "f" * 5_000, "0o777", "1e999", "-.inf", ".nan",
    "yes", "no", "on", "~", "null", "''", "'unterminated", '"\\x00"', "{a: 1, a: 2}",
    "{<<: 5}", "{<<: [1, 2]}", "[1, [2, [3]]]", "\t", "|\n  block", "? [a]\n: 1", "@", "`",
    "%YAML 1.1", "--- a\n--- b", "!<tag:yaml.org,2002:python/none> ''", "\x00", "\x85",
]
values = (st.sampled_from(HOSTILE_YAML) | st.integers().map(str) | st.floats().map(repr)
          | st.text(max_size=12))


def _dotted_keys(tree: dict, prefix: str = "") -> list[str]:
    keys = []
    for name, value in tree.items():
        keys.append(prefix + name)
        if isinstance(value, dict):
            keys += _dotted_keys(value, f"{prefix}{name}.")
    return keys


_DUMPED: dict[str, str] = {}  # repr(value) -> its YAML text


def _dump(value) -> str:
    """A schema value as one line of YAML. Written once per value: every case writes a whole
    config, and PyYAML's pure-Python dumper took some 15% of this file's run time. (repr tells
    apart every value a schema holds: True from 1, 1 from 1.0, a list from its text.)"""
    key = repr(value)
    if key not in _DUMPED:
        _DUMPED[key] = (yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
                        .removesuffix("\n...").removesuffix("..."))
    return _DUMPED[key]


def _yaml_text(tree: dict, replaced: dict[str, str], indent: str = "", prefix: str = "") -> str:
    """The config as YAML lines, with the values at `replaced` keys written as raw text."""
    lines = []
    for name, value in tree.items():
        key = prefix + name
        if key in replaced:
            raw = replaced[key].replace("\n", "\n" + indent + "  ")
            lines.append(f"{indent}{name}: {raw}")
        elif isinstance(value, dict):
            lines.append(f"{indent}{name}:")
            lines.append(_yaml_text(value, replaced, indent + "  ", key + "."))
        else:
            lines.append(f"{indent}{name}: {_dump(value)}")
    return "\n".join(line for line in lines if line)


@st.composite
def hostile_configs(draw) -> tuple[str, bytes, list[str]]:
    """(command, YAML file bytes, overrides)."""
    command = draw(st.sampled_from(sorted(SCHEMAS)))
    tree = SCHEMAS[command]
    keys = _dotted_keys(tree) + ["nope", "train.nope", "model.lora.rank.deeper", ""]
    replaced = {draw(st.sampled_from(keys)): draw(values) for _ in range(draw(st.integers(0, 3)))}
    kind = draw(st.integers(0, 7))
    if kind == 7:  # not a config at all
        data = draw(st.binary(max_size=64) | st.sampled_from(
            [b"", b"\xff\xfe", b"- a\n- b", b"42", b"[" * 600, b"train:\n\tlr: 1",
             b"train: {lr: 1}\ntrain: {lr: 2}", b"\xef\xbb\xbftrain: {}"]))
    else:
        data = _yaml_text(tree, replaced).encode("utf-8", "surrogatepass")
    overrides = [f"{draw(st.sampled_from(keys) | st.text(max_size=8))}"
                 f"{draw(st.sampled_from(['=', '=', '==', ' = ', '']))}{draw(values)}"
                 for _ in range(draw(st.integers(0, 2)))]
    return command, data, overrides


@FUZZ
@given(case=hostile_configs())
def test_hostile_configs(case):
    assert EXAMPLES >= 2000
    command, data, overrides = case
    path = SCRATCH.write("hostile.yaml", data)
    # A bad override is named by its text; everything else by the file.
    clear_or_ok(lambda: load_config(COMMANDS[command], path, overrides),
                ("hostile.yaml", "override"))


def test_the_valid_configs_load():
    for command, tree in SCHEMAS.items():
        path = SCRATCH.write("valid.yaml", _yaml_text(tree, {}))
        assert load_config(COMMANDS[command], path) == COMMANDS[command]()
