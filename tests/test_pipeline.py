"""`hone pipeline`: the tiny sft -> reward -> ppo pipeline end to end, a pipeline killed in its
second stage finishing on the rerun without redoing the first, and pipeline files rejected (exit
code 2, naming `stages[i]...`) before any folder is made.

The runs are `python -m hone.cli pipeline` subprocesses (SIGKILL needs one) with few steps and
no evaluation; they share one JAX compilation cache, as `make test` does, so the second test
reuses the first one's programs (a cached program is the same executable: no number changes).
"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from hone.cli import main
from hone.config.pipeline_schema import load_pipeline
from hone.pipeline import plan

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "configs/tiny/pipeline.yaml"
# Short stages; the reward stage checkpoints every 2 of its 8 steps (the kill test waits for one).
FAST = ["sft.train.max_steps=4", "reward.train.max_steps=8", "reward.checkpoint.every_steps=2",
        "ppo.train.max_steps=2", "sft.data.eval_path=null", "reward.data.eval_path=null",
        "ppo.data.eval_path=null"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    env = dict(os.environ)
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(tmp_path_factory.mktemp("jax-cache")))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    return env


def command(run_dir: Path) -> list[str]:
    return [sys.executable, "-m", "hone.cli", "pipeline", "--config", str(PIPELINE),
            f"run_dir={run_dir}", *FAST]


def finish(run_dir: Path, env) -> subprocess.CompletedProcess:
    out = subprocess.run(command(run_dir), cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    return out


def test_killed_in_the_second_stage_the_rerun_skips_the_first_and_finishes(tmp_path, env):
    """One pipeline run costs three trainings, so the end-to-end checks (each stage from the
    right export, the resolved pipeline.yaml) are made on the run that was killed and rerun."""
    run = tmp_path / "pipe"
    checkpoints = run / "reward" / "checkpoints"
    proc = subprocess.Popen(command(run), cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while not (checkpoints.is_dir() and any(p.name.isdigit() for p in checkpoints.iterdir())):
            assert proc.poll() is None, "the pipeline ended before the reward stage checkpointed"
            assert time.monotonic() < deadline, "no reward checkpoint within 300 s"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    assert not (run / "reward" / "stage_done.json").exists(), "killed too late: reward finished"
    sft_files = [run / "sft/stage_done.json", run / "sft/export/model.safetensors",
                 run / "sft/export", run / "sft/config.yaml"]
    before = [p.stat().st_mtime_ns for p in sft_files]

    out = finish(run, env)
    assert "stage sft: done, skipped" in out.stdout
    assert "[1/3]" not in out.stdout and "[2/3] reward:" in out.stdout
    assert "resumed from step" in out.stderr and str(checkpoints) in out.stderr
    assert [p.stat().st_mtime_ns for p in sft_files] == before
    for name in ["sft", "reward", "ppo"]:
        assert (run / name / "stage_done.json").is_file()
        assert (run / name / "export" / "config.json").is_file()
    assert (run / "reward/export/model.safetensors.index.json").is_file()  # a reward model
    ppo = yaml.safe_load((run / "ppo/config.yaml").read_text())
    assert ppo["model"]["source"] == str(run / "sft/export")
    assert ppo["rewards"]["reward_model"] == str(run / "reward/export")
    reward = yaml.safe_load((run / "reward/config.yaml").read_text())
    assert reward["model"]["source"] == str(run / "sft/export")
    assert reward["train"]["max_steps"] == 8
    assert "[3/3] ppo:" in out.stdout
    assert "pipeline done" in out.stdout and "loss" in out.stdout.split("pipeline done")[1]
    # The resolved pipeline.yaml is a pipeline file that plans the very same stages.
    again = plan(load_pipeline(str(run / "pipeline.yaml")), run / "pipeline.yaml")
    first = plan(load_pipeline(str(PIPELINE), [f"run_dir={run}", *FAST]), PIPELINE)
    assert [p.cfg for p in again] == [p.cfg for p in first]


STAGES = [{"name": "sft", "command": "sft", "config": str(ROOT / "configs/tiny/sft.yaml")},
          {"name": "reward", "command": "reward", "config": str(ROOT / "configs/tiny/reward.yaml")},
          {"name": "ppo", "command": "ppo", "config": str(ROOT / "configs/tiny/ppo.yaml"),
           "reward_model_from": "reward"}]


@pytest.mark.parametrize("change, key, words", [
    ({1: {"command": "rewardd"}}, "stages[1].command", "not a training command"),
    ({2: {"name": "sft"}}, "stages[2].name", "also the name of stages[0]"),
    ({0: {"model_from": "ppo"}}, "stages[0].model_from", "a later stage"),
    ({1: {"model_from": "nope"}}, "stages[1].model_from", "no stage"),
    ({2: {"reward_model_from": "sft"}}, "stages[2].reward_model_from", "not a reward stage"),
    ({2: {"overrides": {"train.lrr": 1e-3}}}, "stages[2].overrides", "Did you mean 'train.lr'"),
    ({2: {"overrides": {"run_dir": "x"}}}, "stages[2].overrides", "sets each stage's run_dir"),
    ({1: {"config": "missing.yaml"}}, "stages[1].config", "config file not found"),
    ({1: {"modle_from": "sft"}}, "stages[1].modle_from", "Did you mean"),
])
def test_bad_pipelines_stop_before_any_folder_is_made(tmp_path, capsys, change, key, words):
    stages = [dict(s, **change.get(i, {})) for i, s in enumerate(STAGES)]
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({"run_dir": str(tmp_path / "run"), "stages": stages}))
    assert main(["pipeline", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"'{key}'" in err and words in err and str(path) in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipeline.yaml"]


def test_command_line_overrides_name_a_stage(tmp_path, capsys):
    args = ["pipeline", "--config", str(PIPELINE), f"run_dir={tmp_path / 'run'}"]
    assert main([*args, "dpo.train.lr=1e-3"]) == 2
    assert "no stage is named 'dpo'" in capsys.readouterr().err
    assert main([*args, "ppo.train.max_steps=0"]) == 2  # checked by the ppo config's own rules
    err = capsys.readouterr().err
    assert "'stages[2].overrides'" in err and "train.max_steps" in err, err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("path", sorted(ROOT.glob("configs/*/pipeline*.yaml")),
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_shipped_pipeline_plans(path):
    # Planning loads every stage's config with the pipeline's overrides: a typo fails here.
    planned = plan(load_pipeline(path), path)
    assert [p.stage.name for p in planned] == [s["name"] for s in
                                                 yaml.safe_load(path.read_text())["stages"]]
    for p in planned[1:]:  # each later stage starts from an earlier stage's model
        assert p.model_from in [q.stage.name for q in planned[:p.index]]
