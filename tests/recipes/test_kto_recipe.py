"""`hone kto` end to end on the tiny preset (it learns; the micro-batch split never changes the
update; a run stopped by SIGTERM resumes exactly; bad labels are named), and `hone grpo` with
grpo.loss_type = cispo (it learns)."""

import dataclasses
import json
from pathlib import Path

import jax
import numpy as np
import optax
import pytest
from flax import nnx

import hone.recipes.kto as kto_recipe
from hone.cli import main
from hone.config import GRPOConfig, KTOConfig, load_config
from hone.data.kto import KTOData, class_balance
from hone.errors import InputError
from hone.models.config import PRESETS
from hone.models.transformer import Transformer
from hone.recipes.grpo import run_grpo
from hone.recipes.kto import make_kto_loss, make_kto_step, run_kto
from hone.tokenizer import load_tokenizer
from hone.train.loop import Interrupted
from hone.train.state import flatten, new_train_state, split_model
from preempt import stop_on_batch

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
    """8 steps of the tiny config on 32 pairs (64 examples) with a precomputed reference,
    evaluated on them at 4 and 8: (log lines, metrics rows, final state). Shared: each run
    costs compiles."""
    run_dir, lines = tmp_path_factory.mktemp("kto-learn"), []
    _, final, _ = run_kto(kto_config(run_dir, *LEARN, "train.eval_every=4",
                                     "data.eval_path=builtin:arithmetic-pref"),
                          log=lines.append)
    return lines, rows(run_dir), final


LEARN = ["train.max_steps=8", "checkpoint.every_steps=0", "kto.reference=precomputed"]


def test_tiny_kto_separates_the_classes_on_its_training_examples(learned):
    lines, metrics, _ = learned
    evals = [r for r in metrics if "eval_margin" in r]
    # At step 0 the policy is its reference: every reward, and the margin, is 0. Measured
    # margins 0.035 then 0.046 (rewards are beta * log-ratio, beta = 0.1).
    assert evals[-1]["eval_margin"] > evals[0]["eval_margin"] > 0.0
    assert all(k in metrics[-1] for k in ("z0", "kl", "rewards_desirable", "margin",
                                          "rewards_undesirable", "logps_desirable",
                                          "logps_undesirable", "eval_kl"))
    # Before the first update the policy is its (precomputed) reference: r = 0, z0 = 0, and
    # each example's loss is σ(0).
    assert metrics[0]["loss"] == pytest.approx(0.5, abs=1e-6)
    assert metrics[0]["z0"] == pytest.approx(0.0, abs=1e-6)
    assert any("64 examples (32 desirable, 32 undesirable)" in l for l in lines)
    assert any(l.startswith("reference log-probs: computed for 64") for l in lines)


def test_sigterm_mid_run_resumes_exactly(learned, tmp_path, monkeypatch):
    """Stopped by SIGTERM during step 3, then run again: the `learned` run's losses and weights,
    bit for bit (evaluation changes neither), the cached reference log-probs reused."""
    cfg = kto_config(tmp_path, *LEARN, "data.eval_path=null")
    stop_on_batch(monkeypatch, kto_recipe, at=3)
    with pytest.raises(Interrupted):
        run_kto(cfg, **QUIET)
    assert (tmp_path / "checkpoints" / "3").exists()  # step 3 finishes, then saves and stops
    assert not (tmp_path / "checkpoints" / "8").exists()
    monkeypatch.undo()
    lines = []
    _, resumed, _ = run_kto(cfg, log=lines.append)
    assert any("reusing" in l for l in lines)
    straight = learned[2]
    assert [r["loss"] for r in rows(tmp_path)] == [r["loss"] for r in learned[1]]
    for k in straight["params"]:
        assert np.array_equal(np.asarray(straight["params"][k]), np.asarray(resumed["params"][k]))


def sgd_update(accum: int, batch) -> tuple[dict, dict]:
    """(parameter deltas, metrics) of one KTO step with `accum` micro-batches: a fresh one-layer
    tiny model (seed 0), a copied reference with its weights scaled by 0.99 (so that
    z0 > 0), plain SGD at 1e4 (the update is the
    gradient, far above the weights' rounding; tests/grpo_sgd.py says why not Adam)."""
    cfg = load_config(KTOConfig, None, [f"train.grad_accum={accum}", "train.batch_size=8",
                                        "kto.desirable_weight=1.3"])
    arch = dataclasses.replace(PRESETS["tiny"], num_layers=1, layer_types=("global",))
    graphdef, params, frozen = split_model(Transformer(arch, rngs=nnx.Rngs(0)), nnx.Param)
    opt = optax.sgd(1e4)
    state = new_train_state(flatten(params), opt, 0)
    start = jax.device_get(state["params"])
    aux = jax.tree.map(lambda x: 0.99 * x, state["params"])
    step = make_kto_step(cfg, graphdef, params, make_kto_loss(cfg, "copy"), opt,
                         optax.constant_schedule(1e4), "copy", accum, None)
    state, metrics = step(state, frozen, batch, aux)
    new = jax.device_get(state["params"])
    return {k: new[k] - start[k] for k in new}, jax.device_get(metrics)


def test_update_does_not_depend_on_the_micro_batch_split():
    """z0 comes from the whole batch's KL rows, scored before the update, so 4 x 2 examples
    give the gradient of 1 x 8."""
    data = KTOData("builtin:arithmetic-pref", load_tokenizer("tiny"), from_pairs=True,
                   max_length=128, max_records=4, batch_size=8)
    batch = next(iter(data.batches()))
    (da, ma), (db, mb) = sgd_update(1, batch), sgd_update(4, batch)
    assert float(ma["z0"]) > 0 and float(ma["z0"]) == pytest.approx(float(mb["z0"]), rel=1e-6)
    assert float(ma["loss"]) == pytest.approx(float(mb["loss"]), rel=1e-6)
    # The two sum the examples' float32 gradients in different orders. The largest difference,
    # as a share of the largest entry, was under 1e-6 (8.4 eps) on AVX-512 machines and 15.3
    # eps on an AVX2 Zen 3 (layers/0/attn/k/kernel, 2026-12-07), where XLA vectorises the sums
    # differently; the bound is twice that.
    tol = 32 * np.finfo(np.float32).eps
    for k in da:
        assert np.max(np.abs(da[k])) > 0, k
        assert np.max(np.abs(da[k] - db[k])) <= tol * np.max(np.abs(da[k])), k


def test_bad_labels_name_file_record_and_field(tmp_path, capsys):
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
    err = capsys.readouterr().err
    assert str(bad) in err and "record 1" in err and "'label'" in err
    assert class_balance(10, 10, 1.0, 1.0) is None
    assert "between 0.5 and 0.667" in class_balance(20, 10, 1.0, 1.0)


def test_tiny_grpo_with_cispo_learns_the_length_reward(tmp_path):
    """configs/tiny/grpo.yaml with grpo.loss_type = cispo (no KL term) learns what the clipped
    loss learns there (tests/recipes/test_rl_recipes.py): a random model writes all 16 tokens,
    the length penalty teaches it to stop early (measured: 16 tokens to 1; with lr 0 it stays at
    16). Two passes over each rollout, so the second pass's weights are not all 1."""
    cfg = load_config(GRPOConfig, str(ROOT / "configs/tiny/grpo.yaml"),
                      [f"run_dir={tmp_path}", "log.sinks=[jsonl]", "train.max_steps=12",
                       "train.eval_every=12", "grpo.loss_type=cispo", "grpo.beta=0",
                       "grpo.clip_eps_high=0.5", "grpo.iterations=2"])
    _, state, _ = run_grpo(cfg, **QUIET)
    start, *m = rows(tmp_path)
    assert len(m) == 12 and all(np.isfinite(r["loss"]) for r in m)
    assert int(state["step"]) == 24  # optimizer updates: 2 per rollout
    assert start["eval_completion_len"] > 14 and m[0]["completion_len_mean"] > 14
    assert m[-1]["eval_completion_len"] < 8 and m[-1]["eval_reward"] > -0.1
    assert "clip_fraction" in m[-1]  # the share of weights at the cap (1 + 0.5)
    with pytest.raises(InputError, match="no KL term"):
        load_config(GRPOConfig, None, ["grpo.loss_type=cispo", "grpo.beta=0.1"])
