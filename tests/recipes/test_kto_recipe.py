"""`hone kto` end to end on the tiny preset (it learns; the micro-batch split never changes the
update; a run stopped by SIGTERM resumes exactly; bad labels are named), and `hone grpo` with
grpo.loss_type = cispo."""

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import hone.recipes.kto as kto_recipe
from hone.cli import main
from hone.config import GRPOConfig, KTOConfig, load_config
from hone.data.kto import KTOData, class_balance
from hone.errors import InputError
from hone.models.loading import load_tokenizer
from hone.recipes.grpo import run_grpo
from hone.recipes.kto import run_kto
from hone.train.loop import Interrupted

ROOT = Path(__file__).resolve().parents[2]
KTO = str(ROOT / "configs/tiny/kto.yaml")
QUIET = dict(log=lambda s: None)


def rows(run_dir) -> list[dict]:
    return [json.loads(l) for l in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def kto_config(run_dir, *overrides):
    return load_config(KTOConfig, KTO, [f"run_dir={run_dir}", "log.sinks=[jsonl]",
                                        "data.max_records=32", *overrides])


@pytest.fixture(scope="module")
def learned(tmp_path_factory):
    """8 steps of the tiny config on 32 pairs (64 examples), evaluated on them at 4 and 8: its
    log lines and metrics rows (shared: each run costs a compile)."""
    run_dir, lines = tmp_path_factory.mktemp("kto-learn"), []
    run_kto(kto_config(run_dir, "train.max_steps=8", "train.eval_every=4",
                       "checkpoint.every_steps=0", "data.eval_path=builtin:arithmetic-pref"),
            log=lines.append)
    return lines, rows(run_dir)


def test_tiny_kto_separates_the_classes_on_its_training_examples(learned):
    lines, metrics = learned
    evals = [r for r in metrics if "eval_margin" in r]
    # At step 0 the policy is its reference: every reward, and the margin, is 0. Measured
    # margins 0.035 then 0.046 (rewards are beta * log-ratio, beta = 0.1).
    assert evals[-1]["eval_margin"] > evals[0]["eval_margin"] > 0.0
    assert all(k in metrics[-1] for k in ("z0", "kl", "rewards_desirable", "margin",
                                          "rewards_undesirable", "logps_desirable",
                                          "logps_undesirable", "eval_kl"))
    # Before the first update the policy is its reference: r = 0, z0 = 0, each loss σ(0).
    assert metrics[0]["loss"] == pytest.approx(0.5, abs=1e-6)
    assert metrics[0]["z0"] == pytest.approx(0.0, abs=1e-6)
    assert any("64 examples (32 desirable, 32 undesirable)" in l for l in lines)
    assert any("reference: copy" in l for l in lines)


def stop_on_batch(monkeypatch, at: int):
    """SIGTERM to this process when the loop draws training batch `at` (a preemption)."""
    real = kto_recipe.run_loop

    def run_loop(spec, cfg, run_dir):
        data, calls = spec.data, [0]

        class Stopping:
            def next(self):
                calls[0] += 1
                if calls[0] == at:
                    os.kill(os.getpid(), signal.SIGTERM)
                return data.next()

            def __getattr__(self, name):
                return getattr(data, name)

        spec.data = Stopping()
        return real(spec, cfg, run_dir)

    monkeypatch.setattr(kto_recipe, "run_loop", run_loop)


def test_micro_batches_precomputed_reference_and_sigterm_resume(learned, tmp_path,
                                                                 monkeypatch):
    """2 x 4 micro-batches give the losses of 1 x 8 (the `learned` run: z0 comes from the whole
    batch's KL rows either way; its reference a copy, here precomputed); a run stopped by
    SIGTERM after step 2 resumes to the same losses and weights, its cached reference
    log-probs reused."""
    common = ["train.max_steps=3", "data.eval_path=null", "checkpoint.every_steps=0",
              "kto.reference=precomputed", "train.grad_accum=2"]
    _, straight, _ = run_kto(kto_config(tmp_path / "straight", *common), **QUIET)
    losses = [r["loss"] for r in rows(tmp_path / "straight")]
    # Steps 1 and 2 (the learned run's cosine schedule spans 8 steps, so its later learning
    # rates differ): step 2's loss and KL rows are scored with the weights of the first update.
    second = [rows(tmp_path / "straight")[1][k] for k in ("loss", "kl")]
    np.testing.assert_allclose(losses[:2], [r["loss"] for r in learned[1][:2]], rtol=1e-5)
    np.testing.assert_allclose(second, [learned[1][1][k] for k in ("loss", "kl")], rtol=1e-5)

    cfg = kto_config(tmp_path / "stopped", *common)
    stop_on_batch(monkeypatch, at=2)
    with pytest.raises(Interrupted):
        run_kto(cfg, **QUIET)
    assert (tmp_path / "stopped" / "checkpoints" / "2").exists()
    monkeypatch.undo()
    lines = []
    _, resumed, _ = run_kto(cfg, log=lines.append)
    assert any("reusing" in l for l in lines)
    assert [r["loss"] for r in rows(tmp_path / "stopped")] == losses
    for k in straight["params"]:
        assert np.array_equal(np.asarray(straight["params"][k]), np.asarray(resumed["params"][k]))


def test_bad_labels_name_file_record_and_field(tmp_path):
    tok = load_tokenizer("tiny")
    good = {"prompt": "2 + 2?", "completion": "4", "label": True}
    for record, message in (({"prompt": "a", "completion": "b"}, "missing field"),
                            ({"prompt": "a", "completion": "b", "label": "yes"},
                             "must be true or false, got str"),
                            ({"prompt": "a", "completion": "b", "label": 1},
                             "must be true or false, got int")):
        with pytest.raises(InputError, match=message) as err:
            KTOData("mine.jsonl", tok, records=[good, record])
        assert err.value.path == "mine.jsonl" and err.value.key == "label"
        assert "record 1" in str(err.value)
    # From the command line: exit code 2, the file, record and field in the message.
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    assert main(["kto", "--config", KTO, f"run_dir={tmp_path / 'run'}", f"data.path={bad}",
                 "data.from_pairs=false", "data.eval_path=null"]) == 2
    assert class_balance(10, 10, 1.0, 1.0) is None
    assert "between 0.5 and 0.667" in class_balance(20, 10, 1.0, 1.0)


def test_grpo_with_cispo_runs_two_steps(tmp_path):
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/grpo.yaml"),
                      [f"run_dir={tmp_path}", "log.sinks=[jsonl]", "train.max_steps=2",
                       "data.eval_path=null", "grpo.loss_type=cispo", "grpo.beta=0",
                       "grpo.clip_eps_high=0.5"])
    _, state, _ = run_grpo(cfg, **QUIET)
    m = rows(tmp_path)
    assert int(state["step"]) == 2 and all(np.isfinite(r["loss"]) for r in m if "loss" in r)
    with pytest.raises(InputError, match="no KL term"):
        load_config(GRPOConfig, None, ["grpo.loss_type=cispo", "grpo.beta=0.1"])
