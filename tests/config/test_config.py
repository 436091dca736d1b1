"""hone.config: YAML + overrides -> frozen dataclasses, the errors users see, and the dump round trip."""

import dataclasses
import os
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.config import (SFTConfig, TrainConfig, TrainSection, dump_yaml, load_config, to_dict)
from hone.errors import InputError

REPO = Path(__file__).resolve().parents[2]


def _write(tmp_path, text, name="cfg.yaml"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _error(tmp_path, text, overrides=()):
    """The InputError message for loading `text` (None = no file) with `overrides`."""
    path = None if text is None else _write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, path, overrides)
    return str(info.value), info.value, path


def _get(cfg, dotted):
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg


# --- defaults and the shipped example ---------------------------------------------------------


def test_empty_file_and_no_file_give_the_defaults(tmp_path):
    assert load_config(SFTConfig, _write(tmp_path, "")) == SFTConfig()
    assert load_config(SFTConfig, _write(tmp_path, "# only a comment\n")) == SFTConfig()
    assert load_config(SFTConfig, None) == SFTConfig()
    # An empty section is its defaults too.
    assert load_config(SFTConfig, _write(tmp_path, "model:\n  lora:\n")) == SFTConfig()


def test_configs_tiny_sft_loads():
    cfg = load_config(SFTConfig, REPO / "configs/tiny/sft.yaml")
    assert isinstance(cfg, SFTConfig)
    assert cfg.run_dir == "runs/tiny-sft"
    assert cfg.model.source == "tiny" and cfg.data.path == "builtin:arithmetic"
    assert (cfg.train.max_steps, cfg.train.batch_size, cfg.train.lr) == (60, 8, 3e-3)
    assert cfg.data.max_length == 96
    assert cfg.checkpoint.every_steps == 20 and cfg.train.eval_every == 20


def test_configs_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        SFTConfig().train.lr = 1.0


# --- unknown keys -------------------------------------------------------------------------------


def test_unknown_top_level_key_names_key_file_and_near_match(tmp_path):
    message, err, path = _error(tmp_path, "trian:\n  lr: 0.1\n")
    assert path in message and "'trian'" in message
    assert "Did you mean 'train'?" in message
    assert "run_dir, model, data, train, checkpoint, log, mesh" in message
    assert err.key == "trian" and err.path == path


def test_unknown_nested_key_names_dotted_key_and_the_keys_of_its_section(tmp_path):
    message, err, path = _error(tmp_path, "model:\n  lora:\n    rnak: 8\n")
    assert path in message and "'model.lora.rnak'" in message
    assert "Did you mean 'model.lora.rank'?" in message
    assert "Keys allowed in 'model.lora': rank, alpha, dropout, targets, quantize" in message
    # "lrate" is nearer to "remat" by edit ratio; the shared start picks "lr".
    message, _, _ = _error(tmp_path, "train:\n  lrate: 1\n")
    assert "Did you mean 'train.lr'?" in message


def test_a_key_in_the_wrong_section_points_to_the_right_one(tmp_path):
    message, _, _ = _error(tmp_path, "train:\n  max_length: 64\n")
    assert "'train.max_length'" in message and "Did you mean 'data.max_length'?" in message


def test_unknown_key_in_an_override(tmp_path):
    message, err, _ = _error(tmp_path, "train:\n  lr: 0.1\n", ["train.lrr=3e-4"])
    assert "'train.lrr'" in message and "Did you mean 'train.lr'?" in message
    assert "override 'train.lrr=3e-4'" in message and err.key == "train.lrr"
    message, _, _ = _error(tmp_path, None, ["mdoel.source=tiny"])
    assert "'mdoel'" in message and "Did you mean 'model'?" in message


@pytest.mark.parametrize("override, phrase", [
    ("model.lora=8", "'model.lora': names a section"),
    ("train=1", "'train': names a section"),
    ("train.lr.x=1", "'train.lr' is a value, not a section"),
    ("train.lr", "must look like section.key=value"),
    ("train..lr=1", "must look like section.key=value"),
])
def test_malformed_overrides_name_the_key(override, phrase):
    with pytest.raises(InputError, match=phrase):
        load_config(SFTConfig, None, [override])


# --- types, allowed values, bounds -------------------------------------------------------------


@pytest.mark.parametrize("text, key, phrase", [
    ("train:\n  max_steps: 1.5\n", "train.max_steps", "expected an integer, got 1.5"),
    ("train:\n  max_steps: true\n", "train.max_steps", "expected an integer, got true"),
    ("train:\n  max_steps: 1e3\n", "train.max_steps", "expected an integer, got 1000.0"),
    ("train:\n  lr: fast\n", "train.lr", "expected a number, got 'fast'"),
    ("train:\n  lr: .nan\n", "train.lr", "expected a finite number"),
    ("data:\n  pack: yes\n", "data.pack", "expected true or false, got 'yes'"),
    ("model:\n  source: 3\n", "model.source", "expected a string, got 3"),
    ("data:\n  eval_path: [a]\n", "data.eval_path", "expected a string or null, got ['a']"),
    ("data:\n  max_length: null\n", "data.max_length", "expected an integer, got null"),
    ("log:\n  sinks: jsonl\n", "log.sinks", "expected a list of strings, got 'jsonl'"),
    ("log:\n  sinks: [jsonl, 3]\n", "log.sinks", "item 2 of ['jsonl', 3]: expected a string"),
    ("model: tiny\n", "model", "expected a section"),
    ("- a\n- b\n", None, "expected sections (key: value lines) at the top level"),
])
def test_wrong_type_names_key_expected_type_and_value(tmp_path, text, key, phrase):
    message, err, path = _error(tmp_path, text)
    assert phrase in message and path in message
    assert err.key == key


def test_ints_are_accepted_as_floats(tmp_path):
    cfg = load_config(SFTConfig, _write(tmp_path, "train:\n  lr: 1\n  max_grad_norm: 0\n"))
    assert cfg.train.lr == 1.0 and type(cfg.train.lr) is float
    assert type(cfg.train.max_grad_norm) is float


def test_yaml_12_scalars(tmp_path):
    # PyYAML's YAML 1.1 rules read "3e-4" as a string and "on" as a boolean; ours do not.
    text = "train:\n  lr: 3e-4\n  eps: 1E-8\n  max_steps: 012\nrun_dir: on\n"
    cfg = load_config(SFTConfig, _write(tmp_path, text))
    assert cfg.train.lr == 3e-4 and cfg.train.eps == 1e-8 and cfg.train.max_steps == 12
    assert cfg.run_dir == "on"


@pytest.mark.parametrize("override, key, allowed", [
    ("model.dtype=float16", "model.dtype", "choose one of: float32, bfloat16"),
    ("model.lora.quantize=nf8", "model.lora.quantize", "choose one of: none, nf4, int8"),
    ("data.format=chat", "data.format", "auto, messages, prompt_completion, text"),
    ("train.schedule=cos", "train.schedule", "constant, linear, cosine"),
    ("train.remat=all", "train.remat", "none, full, save_dots, save_attention, offload"),
    ("log.sinks=[jsonl,mlflow]", "log.sinks", "console, jsonl, tensorboard, prometheus, wandb"),
])
def test_a_value_outside_the_choices_lists_the_allowed_ones(override, key, allowed):
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, None, [override])
    assert info.value.key == key and "is not allowed" in str(info.value)
    assert allowed in str(info.value)


@pytest.mark.parametrize("text, key, phrase", [
    ("train:\n  max_steps: 0\n", "train.max_steps", "must be >= 1, got 0"),
    ("data:\n  max_length: 4\n", "data.max_length", "must be >= 8, got 4"),
    ("data:\n  max_records: 0\n", "data.max_records", "must be >= 1, got 0"),
    ("model:\n  lora:\n    rank: -1\n", "model.lora.rank", "must be >= 0"),
    ("model:\n  lora:\n    dropout: 1.0\n", "model.lora.dropout", "must be < 1.0, got 1.0"),
    ("train:\n  min_lr_ratio: 1.5\n", "train.min_lr_ratio", "must be <= 1.0, got 1.5"),
    ("log:\n  peak_flops: 0\n", "log.peak_flops", "must be > 0.0, got 0.0"),
    ("checkpoint:\n  keep: 0\n", "checkpoint.keep", "must be >= 1"),
    ("mesh:\n  tp: 0\n", "mesh.tp", "must be -1 (the devices left over) or a size >= 1"),
    ("model:\n  lora:\n    targets: '(q|v'\n", "model.lora.targets", "not a valid regular exp"),
])
def test_bounds_name_the_key_and_the_bound(tmp_path, text, key, phrase):
    message, err, path = _error(tmp_path, text)
    assert phrase in message and path in message and err.key == key


def test_python_built_configs_obey_the_same_rules():
    with pytest.raises(InputError, match="'train.max_steps': must be >= 1"):
        SFTConfig(train=TrainSection(max_steps=0))
    with pytest.raises(InputError, match="'train.batch_size'"):
        TrainConfig(train=TrainSection(batch_size=6, grad_accum=4))


# --- rules between fields -----------------------------------------------------------------------


@pytest.mark.parametrize("text, key, phrase", [
    ("train:\n  batch_size: 8\n  grad_accum: 3\n", "train.batch_size",
     "8 is not divisible by train.grad_accum (3)"),
    ("train:\n  max_steps: 10\n  warmup_steps: 10\n", "train.warmup_steps",
     "10 must be less than train.max_steps (10)"),
    ("model:\n  lora:\n    quantize: nf4\n", "model.lora.quantize", "model.lora.rank > 0"),
    ("mesh:\n  data: -1\n  fsdp: -1\n", "mesh.fsdp", "mesh.data and mesh.fsdp"),
    ("run_dir: ''\n", "run_dir", "must name a folder"),
])
def test_cross_field_errors_name_the_keys_and_the_file(tmp_path, text, key, phrase):
    message, err, path = _error(tmp_path, text)
    assert phrase in message and f"'{key}'" in message
    assert err.path == path and path in message and err.key == key


def test_cross_field_error_mentions_the_override_involved(tmp_path):
    message, err, path = _error(tmp_path, "train:\n  batch_size: 8\n", ["train.grad_accum=3"])
    assert path in message and "with the override 'train.grad_accum=3'" in message


def test_overrides_can_repair_a_file_before_the_cross_field_check(tmp_path):
    path = _write(tmp_path, "train:\n  batch_size: 8\n  grad_accum: 3\n")
    assert load_config(SFTConfig, path, ["train.grad_accum=4"]).train.grad_accum == 4


# --- YAML and file errors -----------------------------------------------------------------------


def test_yaml_syntax_error_names_file_and_line(tmp_path):
    message, err, path = _error(tmp_path, "run_dir: runs/x\ntrain:\n  lr: [0.1\nmesh: 1\n")
    assert message.startswith(path + ": invalid YAML at line 4")
    assert "line 3" in message  # where the unclosed list started
    message, _, _ = _error(tmp_path, "train:\n\tlr: 1\n")
    assert "invalid YAML at line 2" in message


def test_duplicate_keys_are_an_error(tmp_path):
    message, _, path = _error(tmp_path, "train:\n  lr: 0.1\n  lr: 0.2\n")
    assert path in message and "line 3" in message and "duplicate key 'lr'" in message


def test_missing_file_is_named(tmp_path):
    path = str(tmp_path / "nope.yaml")
    with pytest.raises(InputError, match="nope.yaml: config file not found") as info:
        load_config(SFTConfig, path)
    assert info.value.path == path


def test_python_tags_are_refused(tmp_path):
    message, _, _ = _error(tmp_path, "run_dir: !!python/object/apply:os.getcwd []\n")
    assert "invalid YAML" in message


# --- overrides ----------------------------------------------------------------------------------


def test_override_values_take_the_field_types(tmp_path):
    path = _write(tmp_path, "data:\n  eval_path: some.jsonl\nlog:\n  sinks: [console]\n")
    cfg = load_config(SFTConfig, path, [
        "train.lr=3e-4", "data.eval_path=null", "log.sinks=[jsonl]", "train.max_steps=7",
        "data.pack=true", "model.lora.targets=.*/attn/[qv]", "run_dir=runs/a #2",
        "model.source='quoted'", "data.max_records=null", "log.peak_flops=1e15"])
    assert cfg.train.lr == 3e-4 and type(cfg.train.lr) is float
    assert cfg.data.eval_path is None
    assert cfg.log.sinks == ("jsonl",)
    assert cfg.train.max_steps == 7 and cfg.data.pack is True
    # String fields take the text as written (a YAML list, a comment otherwise), unless quoted.
    assert cfg.model.lora.targets == ".*/attn/[qv]" and cfg.run_dir == "runs/a #2"
    assert cfg.model.source == "quoted"
    assert cfg.data.max_records is None and cfg.log.peak_flops == 1e15


def test_later_overrides_win_and_type_errors_name_the_override():
    assert load_config(SFTConfig, None, ["train.seed=1", "train.seed=2"]).train.seed == 2
    with pytest.raises(InputError) as info:
        load_config(SFTConfig, None, ["train.max_steps=ten"])
    assert "expected an integer, got 'ten'" in str(info.value)
    assert "override 'train.max_steps=ten'" in str(info.value)


# --- a schema other than the training one -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Inner:
    sizes: tuple[int, ...] = (1, 2)
    scale: float | None = None


@dataclasses.dataclass(frozen=True)
class _Outer:
    name: str = "x"
    inner: _Inner = dataclasses.field(default_factory=_Inner)


def test_the_loader_knows_no_schema(tmp_path):
    cfg = load_config(_Outer, _write(tmp_path, "inner:\n  sizes: [3, 4]\n"), ["inner.scale=2"])
    assert cfg == _Outer(inner=_Inner(sizes=(3, 4), scale=2.0))
    assert to_dict(cfg) == {"name": "x", "inner": {"sizes": [3, 4], "scale": 2.0}}
    with pytest.raises(InputError, match=r"item 1 of \['a'\]: expected an integer"):
        load_config(_Outer, None, ["inner.sizes=[a]"])


# --- dump and load back -------------------------------------------------------------------------

_SINKS = ("console", "jsonl", "tensorboard", "prometheus")
# Any printable text without a quote at the start (quoted override text is read as YAML).
_TEXT = st.text(st.characters(categories=("L", "N", "P", "S", "Zs")), min_size=1, max_size=16)
_TEXT = _TEXT.filter(lambda s: s[0] not in "'\"" and s.strip() not in ("", "~", "null", "Null",
                                                                       "NULL"))


def _float_text(x):
    return repr(x)


@st.composite
def _overrides(draw):
    """(override texts, {dotted key: the value the config must hold})."""
    want = {}
    want["run_dir"] = draw(_TEXT)
    want["model.source"] = draw(_TEXT)
    want["model.dtype"] = draw(st.sampled_from(("float32", "bfloat16")))
    want["model.lora.rank"] = draw(st.integers(1, 2**40))
    want["model.lora.dropout"] = draw(st.floats(0.0, 1.0, exclude_max=True))
    want["model.lora.quantize"] = draw(st.sampled_from(("none", "nf4", "int8")))
    want["data.eval_path"] = draw(st.none() | _TEXT)
    want["data.pack"] = draw(st.booleans())
    want["data.max_records"] = draw(st.none() | st.integers(1, 10**12))
    want["train.lr"] = draw(st.floats(0.0, 1e3))
    want["train.b2"] = draw(st.floats(0.0, 1.0, exclude_max=True))
    grad_accum = draw(st.integers(1, 16))
    want["train.grad_accum"] = grad_accum
    want["train.batch_size"] = grad_accum * draw(st.integers(1, 16))
    want["train.max_steps"] = draw(st.integers(1, 10**7))
    want["train.warmup_steps"] = draw(st.integers(0, want["train.max_steps"] - 1))
    want["log.sinks"] = tuple(draw(st.lists(st.sampled_from(_SINKS), max_size=4)))
    want["log.peak_flops"] = draw(st.none() | st.floats(1e-3, 1e18))
    want["mesh.fsdp"] = draw(st.sampled_from((-1, 1, 2, 8)))
    want["mesh.data"] = 1 if want["mesh.fsdp"] == -1 else draw(st.sampled_from((-1, 1, 4)))
    want["mesh.mode"] = draw(st.sampled_from(("gspmd", "allreduce")))
    want["log.profile_steps"] = tuple(draw(st.lists(st.integers(1, 10**6), max_size=3)))

    def text(value):
        if value is None:
            return "null"
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float):
            return _float_text(value)
        if isinstance(value, tuple):
            return "[" + ",".join(map(str, value)) + "]"
        return str(value)

    return [f"{key}={text(value)}" for key, value in want.items()], want


@settings(max_examples=60, deadline=None)
@given(_overrides())
def test_dump_then_load_gives_back_an_equal_config(case):
    overrides, want = case
    cfg = load_config(SFTConfig, None, overrides)
    for key, value in want.items():
        got = _get(cfg, key)
        assert got == value and type(got) is type(value), key
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "run", "config.yaml")
        text = dump_yaml(cfg, path)
        assert Path(path).read_text(encoding="utf-8") == text
        assert load_config(SFTConfig, path) == cfg
    # Plain YAML 1.1 readers (yaml.safe_load) read the same values: strings like "yes" or "3e-4"
    # are quoted.
    assert yaml.safe_load(text) == to_dict(cfg)


def test_a_partial_section_keeps_the_commands_own_defaults():
    """An override of one data key keeps the rest of the command's own data defaults (the RL
    commands' prompts, DPO's pairs), not the generic section's."""
    from hone.config import DPOConfig, GRPOConfig
    grpo = load_config(GRPOConfig, None, ["data.max_records=8"])
    assert (grpo.data.path, grpo.data.overlong, grpo.data.max_records) == (
        "builtin:arithmetic-rl", "drop", 8)
    assert load_config(DPOConfig, None, ["data.max_length=64"]).data.path == "builtin:arithmetic-pref"
