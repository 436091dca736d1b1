"""The wandb sink against a stand-in `wandb` module (the package is not a dependency, and
tests reach no network): a run logs every row with hone's step, a resumed run continues the
same W&B run, and without the package the run stops naming log.sinks."""

import sys
import types
from pathlib import Path

import pytest

from hone.config import SFTConfig, load_config
from hone.errors import InputError
from hone.recipes.sft import run_sft

ROOT = Path(__file__).resolve().parents[2]


class FakeRun:
    def __init__(self, **kwargs):
        self.init, self.rows, self.finished = kwargs, [], False

    def log(self, row):
        self.rows.append(row)

    def finish(self):
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch):
    runs = []
    module = types.ModuleType("wandb")
    module.init = lambda **kw: runs.append(FakeRun(**kw)) or runs[-1]
    monkeypatch.setitem(sys.modules, "wandb", module)
    return runs


def config(run_dir, steps):
    return load_config(SFTConfig, str(ROOT / "configs/tiny/sft.yaml"), [
        f"run_dir={run_dir}", f"train.max_steps={steps}", "log.sinks=[wandb]",
        "log.wandb_project=hone-tests", "data.max_records=32", "data.eval_path=null",
        "checkpoint.every_steps=2", "train.schedule=constant"])


def test_rows_go_to_one_wandb_run_across_a_resume(tmp_path, fake_wandb):
    run_sft(config(tmp_path, 2), log=lambda s: None)
    run_sft(config(tmp_path, 3), log=lambda s: None)
    first, second = fake_wandb
    assert first.init["project"] == "hone-tests" and first.init["resume"] == "allow"
    assert second.init["id"] == first.init["id"] == (tmp_path / "wandb_id").read_text().strip()
    assert first.init["config"]["train"]["max_steps"] == 2  # the resolved config.yaml
    assert [r["step"] for r in first.rows + second.rows] == [1, 2, 3]
    assert all(isinstance(r["loss"], float) for r in first.rows + second.rows)
    assert first.finished and second.finished


def test_without_the_package_the_run_names_log_sinks(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb raises ImportError
    with pytest.raises(InputError, match="log.sinks"):
        run_sft(config(tmp_path, 1), log=lambda s: None)
