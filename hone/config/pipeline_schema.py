"""The configuration of `hone pipeline`: training stages in order, each from an earlier one's model.

This file owns the pipeline file's keys, their rules and `load_pipeline` (YAML plus command-line
overrides -> `PipelineConfig`); `hone.pipeline` loads each stage's own config and runs the stages.
Design choices:

- A stage names a training command and that command's ordinary config file, plus `overrides`
  written as a mapping of the dotted keys the command line takes (`train.max_steps: 20`). Nothing
  of a stage's config is repeated here, so every stage config still runs alone.
- A stage's `config:` path is read relative to the pipeline file's folder (an absolute path as
  is), so `hone pipeline --config configs/tiny/pipeline.yaml` works from any working folder.
  Paths inside the stage configs (data files, model sources) stay relative to the working folder,
  as they are for `hone sft --config ...`.
- `model_from` and `reward_model_from` may only name earlier stages, so the stage order is the
  run order and a rerun can skip finished stages front to back.
- Rules between stages live in `PipelineConfig.__post_init__` (InputError with the key
  `stages[i].field`, `i` counted from 0); the loader adds the file.
- The command line may set `run_dir=...` and any stage key as `STAGE.section.key=value`, which
  joins (or replaces) that stage's overrides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from hone.config.fields import Problem, convert, fields_of, show, unknown_key
from hone.config.yaml_io import read_yaml
from hone.errors import InputError

STAGE_COMMANDS = ("sft", "dpo", "kto", "reward", "grpo", "ppo", "distill")
_RL = ("grpo", "ppo", "dpo")  # the commands with a `rewards:` section (dpo: online only)
# One folder name: no path, no dot (so `STAGE.key=value` splits at the first dot, and no stage
# folder can be named like the pipeline.yaml beside them).
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")  # dotted config key


@dataclass(frozen=True)
class Stage:
    # Unique folder-safe word (letters, digits, _ and -): the stage runs in <run_dir>/<name>.
    name: str = ""
    # The training command: sft, dpo, reward, grpo, ppo or distill.
    command: str = ""
    # That command's YAML config; a relative path is read from the pipeline file's folder.
    config: str = ""
    # (dotted key, value) pairs applied on top of the config, as `key=value` on the command
    # line; written in YAML as a mapping (`train.max_steps: 20`).
    overrides: tuple[tuple[str, Any], ...] = ()
    # The earlier stage whose exported model this stage starts from (model.source); None = the
    # nearest earlier stage that is not a reward stage (the first stage, or a stage whose
    # overrides set model.source, keeps its own).
    model_from: str | None = None
    # grpo/ppo/online dpo: the earlier reward stage whose exported reward model scores the
    # rollouts (rewards.reward_model); None = the config's own rewards.
    reward_model_from: str | None = None


@dataclass(frozen=True)
class PipelineConfig:
    # Folder of the whole pipeline: pipeline.yaml (as resolved) and one run folder per stage.
    run_dir: str = "runs/pipeline"
    # The stages, run in this order.
    stages: tuple[Stage, ...] = ()

    def __post_init__(self):
        if not self.run_dir.strip():
            raise InputError("must name a folder, got an empty string", key="run_dir")
        if not self.stages:
            raise InputError("a pipeline needs at least one stage", key="stages")
        seen: dict[str, int] = {}  # name -> index of the stages before the one being checked
        for i, s in enumerate(self.stages):
            at = f"stages[{i}]."
            for key in ("name", "command", "config"):
                if not getattr(s, key):
                    raise InputError("is required", key=at + key)
            if not _NAME.fullmatch(s.name):
                raise InputError(f"{s.name!r} is not a folder-safe word (letters, digits, _ and -, "
                                 f"at most 64, starting with a letter or digit)", key=at + "name")
            if s.name in seen:
                raise InputError(f"{s.name!r} is also the name of stages[{seen[s.name]}]; "
                                 f"each stage needs its own name (its run folder)", key=at + "name")
            if s.command not in STAGE_COMMANDS:
                raise InputError(f"{s.command!r} is not a training command; choose one of: "
                                 + ", ".join(STAGE_COMMANDS), key=at + "command")
            keys = [k for k, _ in s.overrides]
            for k in keys:
                if not _KEY.fullmatch(k):
                    raise InputError(f"{k!r} is not a dotted config key such as train.lr",
                                     key=at + "overrides")
            if "run_dir" in keys:
                raise InputError(f"the pipeline sets each stage's run_dir (<run_dir>/{s.name}); "
                                 f"set the pipeline's run_dir instead", key=at + "overrides")
            if s.model_from is not None:
                self._check_from(i, s.model_from, "model_from", seen)
                if self.stages[seen[s.model_from]].command == "reward":
                    raise InputError(f"{s.model_from!r} is a reward stage: its export is a reward "
                                     f"model, not a language model to train",
                                     key=at + "model_from")
                if "model.source" in keys:
                    raise InputError("model_from and an override of model.source both set the "
                                     "model; keep one", key=at + "model_from")
            if s.reward_model_from is not None:
                if s.command not in _RL:
                    raise InputError(f"only grpo, ppo and online dpo stages score with a reward "
                                     f"model, this is a {s.command} stage",
                                     key=at + "reward_model_from")
                self._check_from(i, s.reward_model_from, "reward_model_from", seen)
                if self.stages[seen[s.reward_model_from]].command != "reward":
                    raise InputError(f"{s.reward_model_from!r} is a "
                                     f"{self.stages[seen[s.reward_model_from]].command} stage, "
                                     f"not a reward stage", key=at + "reward_model_from")
                if "rewards.reward_model" in keys:
                    raise InputError("reward_model_from and an override of rewards.reward_model "
                                     "both set the reward model; keep one",
                                     key=at + "reward_model_from")
            seen[s.name] = i

    def _check_from(self, i: int, name: str, key: str, earlier: dict[str, int]) -> None:
        if name in earlier:
            return
        later = [s.name for s in self.stages[i:]]
        why = ("this stage itself" if name == self.stages[i].name else "a later stage"
               if name in later else "no stage")
        raise InputError(f"names {why} ({name!r}); it must name an earlier stage: "
                         + (", ".join(earlier) or "there is none before this one"),
                         key=f"stages[{i}].{key}")


def _stage(i: int, raw: Any, where: str) -> Stage:
    at = f"stages[{i}]"
    if not isinstance(raw, Mapping):
        raise InputError(f"expected a stage (name:, command:, config: ...), got {show(raw)}",
                         path=where, key=at)
    kwargs = {}
    for name, value in raw.items():
        fields = fields_of(Stage)
        if name not in fields:
            name = name if isinstance(name, str) else show(name)
            raise InputError(unknown_key(PipelineConfig, Stage, at + ".", name),
                             path=where, key=f"{at}.{name}")
        if name == "overrides":
            value = {} if value is None else value
            if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
                raise InputError(f"expected dotted keys and values (train.max_steps: 20), got "
                                 f"{show(value)}", path=where, key=f"{at}.overrides")
            kwargs[name] = tuple(value.items())
            continue
        try:
            kwargs[name] = convert(fields[name][1], value)
        except Problem as p:
            raise InputError(str(p), path=where, key=f"{at}.{name}") from None
    return Stage(**kwargs)


def _apply(raw: dict, stages: list, text: str) -> None:
    """One command-line override: `run_dir=...`, or `STAGE.key=value` into that stage."""
    key, sep, value = text.partition("=")
    key = key.strip()
    if key == "run_dir" and sep:
        raw["run_dir"] = value
        return
    name, dot, rest = key.partition(".")
    if not sep or not dot or not rest:
        raise InputError(f"a pipeline override is run_dir=FOLDER or STAGE.section.key=value, "
                         f"got '{text}'")
    for i, s in enumerate(stages):
        if isinstance(s, Mapping) and s.get("name") == name:
            over = s.get("overrides") or {}
            if not isinstance(over, Mapping):
                return  # the stage's own `overrides:` is wrong; _stage says so
            over = dict(over)
            over.pop(rest, None)  # a replaced key moves to the end: applied last, as written
            over[rest] = value
            stages[i] = dict(s, overrides=over)
            return
    names = [s.get("name") for s in stages if isinstance(s, Mapping)]
    raise InputError(f"no stage is named {name!r} (in the override '{text}'); stages: "
                     + ", ".join(map(str, names)))


def load_pipeline(path: str, overrides=()) -> PipelineConfig:
    """Read the pipeline file `path`, apply `run_dir=...` / `STAGE.key=value` overrides, and
    check its structure; InputError names the file and the key (`stages[i].field`)."""
    raw = read_yaml(path)
    if not isinstance(raw, dict):
        raise InputError(f"expected run_dir: and stages: at the top level, got {show(raw)}",
                         path=path)
    for name in raw:
        if name not in fields_of(PipelineConfig):
            raise InputError(unknown_key(PipelineConfig, PipelineConfig, "", str(name)),
                             path=path, key=str(name))
    stages = raw.get("stages")
    if not isinstance(stages, list):
        raise InputError(f"expected a list of stages (- name: ...), got {show(stages)}",
                         path=path, key="stages")
    raw, stages = dict(raw), list(stages)
    for text in overrides:
        _apply(raw, stages, text)
    try:
        run_dir = convert(str, raw.get("run_dir", PipelineConfig.run_dir))
    except Problem as p:
        raise InputError(str(p), path=path, key="run_dir") from None
    built = tuple(_stage(i, s, path) for i, s in enumerate(stages))
    try:
        return PipelineConfig(run_dir=run_dir, stages=built)
    except InputError as e:
        if e.path is not None:
            raise
        raise InputError(str(e).removeprefix(f"'{e.key}': "), path=path, key=e.key) from None

