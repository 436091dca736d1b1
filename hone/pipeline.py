"""`hone pipeline`: training stages run in order, each from a model an earlier stage exported.

This file owns planning a pipeline (each stage's effective overrides and loaded config), running
the stages, the hand-off between them and the `stage_done.json` markers; the pipeline file's keys
and rules are `hone.config.pipeline_schema`'s. Design choices:

- Every stage is an ordinary run: the same recipe `hone <command>` runs, in the run folder
  `<run_dir>/<name>`, so it resumes from its own checkpoints and `hone export` / `hone report`
  work on it. One process runs all stages (each stage compiles its own programs anyway).
- Models travel between stages as the Hugging Face folder `hone export` writes
  (`<stage>/export`, adapters merged; a reward stage's is its reward model), given to the next
  stage as `model.source` or `rewards.reward_model`. The hand-off is thus the public format, and
  each stage's resolved config.yaml says where its model came from.
- A stage is done when `<stage>/stage_done.json` exists: written last, atomically, after the
  export. A rerun skips done stages without touching their files, so a pipeline killed anywhere
  continues at the stage and step where it stopped. A stage killed after training but before its
  marker trains nothing again (its finished run returns at once); only the export is redone.
- Every stage's config is loaded (with the overrides the pipeline adds) before anything runs or
  any folder is made: a typo in the last stage costs seconds, not the first stages' training.
- `<run_dir>/pipeline.yaml` records the pipeline as resolved: absolute config paths, and the
  model hand-offs as the overrides they became. It is itself a pipeline file that runs the same.
"""

from __future__ import annotations

import gc
import hashlib
import json
import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hone.config import COMMANDS, dump_yaml, load_config
from hone.config.pipeline_schema import PipelineConfig, Stage, load_pipeline
from hone.errors import InputError
from hone.recipes import recipe

DONE = "stage_done.json"  # in a stage's run folder; its presence = the stage is finished
EXPORT = "export"  # the stage's exported model, inside its run folder

# The recipe each command runs (what `hone <command>` calls).
# Metrics the end-of-pipeline summary shows when a stage logged them, besides every eval_ one.
_SUMMARY_KEYS = ("loss", "accuracy", "reward_mean", "kl_seq")


@dataclass(frozen=True)
class Planned:
    """One stage, ready to run: its loaded config and where its models come from."""

    index: int  # 0-based position in the pipeline
    stage: Stage  # as written (plus command-line overrides)
    config_path: Path  # the stage's config file, resolved
    overrides: dict[str, Any]  # effective: the stage's own plus the model hand-offs (no run_dir)
    model_from: str | None  # the stage whose export is model.source (None = the config's own)
    reward_model_from: str | None  # the stage whose export is rewards.reward_model
    cfg: Any  # the loaded TrainConfig subclass of the stage's command

    @property
    def run_dir(self) -> Path:
        return Path(self.cfg.run_dir)


def stage_dir(run_dir: str | Path, name: str) -> Path:
    return Path(run_dir) / name


def export_dir(run_dir: str | Path, name: str) -> Path:
    return stage_dir(run_dir, name) / EXPORT


def _text(value: Any) -> str:
    """A YAML override value as command-line text (`key=TEXT`): strings as written, other values
    as JSON, which YAML reads back the same (true, null, [a, b], 3e-4)."""
    return value if isinstance(value, str) else json.dumps(value)


def plan(pipe: PipelineConfig, path: str | Path) -> list[Planned]:
    """Each stage's effective overrides and loaded config, in order; InputError (naming the
    pipeline file and `stages[i]...`) for the first stage whose config does not load."""
    base = Path(path).parent
    out: list[Planned] = []
    for i, s in enumerate(pipe.stages):
        over = dict(s.overrides)
        model_from = s.model_from
        if model_from is None and "model.source" not in over:  # chain to the newest model
            model_from = next((p.stage.name for p in reversed(out)
                               if p.stage.command != "reward"), None)
        if model_from is not None:
            over["model.source"] = str(export_dir(pipe.run_dir, model_from))
        if s.reward_model_from is not None:
            over["rewards.reward_model"] = str(export_dir(pipe.run_dir, s.reward_model_from))
        config_path = Path(s.config) if Path(s.config).is_absolute() else base / s.config
        texts = [f"{k}={_text(v)}" for k, v in over.items()]
        texts.append(f"run_dir={stage_dir(pipe.run_dir, s.name)}")
        try:
            cfg = load_config(COMMANDS[s.command], config_path, texts)
        except InputError as e:
            key = f"stages[{i}]." + ("config" if e.path is not None else "overrides")
            raise InputError(f"stage {s.name!r} ({s.command}): {e}", path=str(path),
                             key=key) from None
        if cfg.distributed.coordinator or cfg.distributed.auto:
            raise InputError(f"stage {s.name!r} sets distributed.coordinator or "
                             f"distributed.auto; a pipeline runs in one process, so run a "
                             f"multi-host stage alone with `hone {s.command}`", path=str(path),
                             key=f"stages[{i}].config")
        out.append(Planned(i, s, config_path.resolve(), over, model_from, s.reward_model_from,
                           cfg))
    return out


def resolved_yaml(pipe: PipelineConfig, planned: list[Planned]) -> str:
    """`<run_dir>/pipeline.yaml`: the pipeline as it ran, loadable as a pipeline file again."""
    import yaml

    from hone.config.yaml_io import QuotingDumper  # quotes strings any YAML reader would misread

    class Dumper(QuotingDumper):  # stages as indented blocks; short lists stay on one line
        pass

    Dumper.add_representer(list, lambda d, data: d.represent_sequence(
        "tag:yaml.org,2002:seq", data, flow_style=not any(isinstance(x, dict) for x in data)))
    stages = []
    for p in planned:
        entry = {"name": p.stage.name, "command": p.stage.command, "config": str(p.config_path)}
        if p.overrides:
            entry["overrides"] = dict(p.overrides)
        stages.append(entry)
    takes = []
    for p in planned:
        got = [f"model from {p.model_from}"] if p.model_from else []
        got += [f"reward model from {p.reward_model_from}"] if p.reward_model_from else []
        takes += [f"{p.stage.name}: {', '.join(got)}"] if got else []
    header = textwrap.fill(
        "The pipeline as `hone pipeline` resolved it: stage configs as absolute paths, and the "
        "models each stage takes from earlier ones as overrides"
        + (f" ({'; '.join(takes)})" if takes else "") + ". Each stage runs in run_dir/NAME; "
        "this file runs as a pipeline file too.", width=98,
        initial_indent="# ", subsequent_indent="# ") + "\n"
    return header + yaml.dump({"run_dir": pipe.run_dir, "stages": stages}, Dumper=Dumper,
                              sort_keys=False, default_flow_style=False, allow_unicode=True,
                              width=100)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _config_hash(cfg) -> str:
    return hashlib.sha256(dump_yaml(cfg).encode()).hexdigest()


def read_done(p: Planned) -> dict | None:
    """The stage's done marker, when the stage finished and its export is still there."""
    try:
        done = json.loads((p.run_dir / DONE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(done, dict) or not (p.run_dir / EXPORT / "config.json").is_file():
        return None  # a lost export is made again (the finished run does not retrain)
    return done


def _stale(p: Planned, done: dict) -> list[str]:
    """Why a done stage may no longer match what it would train now (it is skipped anyway:
    redoing it means deleting its run folder, which the user decides)."""
    why = []
    if done.get("config_sha256") != _config_hash(p.cfg):
        why.append(f"stage {p.stage.name}'s config changed since it ran")
    mine = (p.run_dir / DONE).stat().st_mtime
    for source in filter(None, (p.model_from, p.reward_model_from)):
        marker = p.run_dir.parent / source / DONE
        if marker.exists() and marker.stat().st_mtime > mine:
            why.append(f"stage {source}, whose model it took, finished again after it")
    return why


def last_metrics(run_dir: Path) -> dict[str, Any]:
    """The newest value of each metric in run_dir/metrics.jsonl ({} without one)."""
    latest: dict[str, Any] = {}
    try:
        lines = (run_dir / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    except OSError:
        return latest
    for line in lines:
        try:
            latest.update(json.loads(line))
        except ValueError:
            continue  # a line cut short by a kill
    return latest


def _summary(metrics: dict[str, Any]) -> str:
    keys = [k for k in _SUMMARY_KEYS if k in metrics]
    keys += [k for k in metrics if k.startswith("eval_")]
    shown = [f"{k} {metrics[k]:.4g}" for k in keys if isinstance(metrics[k], (int, float))]
    return "  ".join(shown) or "(no metrics.jsonl: add jsonl to log.sinks)"


def _run_stage(p: Planned, log) -> None:
    """Train (or resume) the stage, export its model, then mark it done."""
    import jax

    from hone.export import export_run
    from hone.train.loop import Interrupted
    run = recipe(p.stage.command)
    what = f"stage {p.stage.name!r} ({p.stage.command}, {p.run_dir})"
    try:
        run(p.cfg, log=log)  # the trained model it returns is dropped: the export reloads it
    except Interrupted as e:
        raise Interrupted(f"{what}: {e}") from None
    except InputError as e:  # bad data found by the recipe: say which stage read it
        raise InputError(f"{what}: {e}") from None
    # Free this stage's compiled programs and arrays before the next stage builds its own.
    gc.collect()
    jax.clear_caches()
    out = export_run(p.run_dir, p.run_dir / EXPORT, "hf")
    log(f"exported {p.stage.name} -> {out}")
    done = {"stage": p.stage.name, "command": p.stage.command, "export": str(out),
            "final_step": p.cfg.train.max_steps, "config_sha256": _config_hash(p.cfg),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    _write_atomic(p.run_dir / DONE, json.dumps(done, indent=2) + "\n")


def run_pipeline(path: str | Path, overrides=(), *, log=print) -> list[dict[str, Any]]:
    """Run (or continue) the pipeline file `path`; returns one summary row per stage
    (name, command, export, step, metrics). Raises InputError before anything runs when any
    stage's config is bad, and hone.train.loop.Interrupted when a signal stopped a stage."""
    pipe = load_pipeline(str(path), overrides)
    planned = plan(pipe, path)
    root = Path(pipe.run_dir)
    root.mkdir(parents=True, exist_ok=True)
    _write_atomic(root / "pipeline.yaml", resolved_yaml(pipe, planned))
    n = len(planned)
    for p in planned:
        s = p.stage
        done = read_done(p)
        if done is not None:
            log(f"stage {s.name}: done, skipped (step {done.get('final_step')}, "
                f"{p.run_dir / EXPORT})")
            for why in _stale(p, done):
                log(f"  note: {why}; delete {p.run_dir} to train stage {s.name} again")
            continue
        came = [f"model from {p.model_from}" if p.model_from else
                f"model {p.cfg.model.source}"]
        if p.reward_model_from:
            came.append(f"reward model from {p.reward_model_from}")
        log(f"[{p.index + 1}/{n}] {s.name}: hone {s.command} --config {p.config_path} "
            f"-> {p.run_dir} ({', '.join(came)})")
        _run_stage(p, log)
    rows = []
    for p in planned:
        rows.append({"name": p.stage.name, "command": p.stage.command,
                     "export": str(p.run_dir / EXPORT), "step": p.cfg.train.max_steps,
                     "metrics": last_metrics(p.run_dir)})
    width = max(len(r["name"]) for r in rows)
    log(f"pipeline done: {root} ({n} stages; resolved pipeline in {root / 'pipeline.yaml'})")
    for r in rows:
        log(f"  {r['name']:<{width}}  {r['command']:<7} step {r['step']:<5} "
            f"{_summary(r['metrics'])}")
    return rows
