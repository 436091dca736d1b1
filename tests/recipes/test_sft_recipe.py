"""`hone sft` end to end on the tiny preset: it learns, LoRA leaves the base alone, QLoRA keeps
up with LoRA, and bad input stops the run with exit code 2 before anything is saved."""

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import hone
from hone.cli import main
from hone.config import SFTConfig, load_config
from hone.models.lora import LoRAParam
from hone.recipes.sft import run_sft

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs/tiny/sft.yaml")


def config(tmp_path, *overrides):
    return load_config(SFTConfig, TINY, [f"run_dir={tmp_path}", "log.sinks=[jsonl, tensorboard]",
                                         *overrides])


def rows(run_dir) -> list[dict]:
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


def test_tiny_sft_lowers_held_out_loss(tmp_path):
    run_sft(config(tmp_path), log=lambda s: None)
    evals = [r["eval_loss"] for r in rows(tmp_path) if "eval_loss" in r]
    assert len(evals) == 3 and evals[-1] < evals[0] - 0.2
    assert (tmp_path / "config.yaml").exists()
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    assert load_config(SFTConfig, str(tmp_path / "config.yaml")) == config(tmp_path)


def final_losses(run_dir, n=10) -> float:
    return float(np.mean([r["loss"] for r in rows(run_dir)][-n:]))


def test_lora_trains_adapters_only_and_qlora_keeps_up(tmp_path):
    lora = ["model.lora.rank=8", "train.lr=1e-2", "data.eval_path=null"]
    trained, state = run_sft(config(tmp_path / "lora", *lora), log=lambda s: None)
    base = hone.load_model("tiny")
    trained_base = nnx.state(trained, nnx.All(nnx.Param, nnx.Not(LoRAParam)))
    for a, b in zip(jax.tree.leaves(nnx.state(base, nnx.Param)), jax.tree.leaves(trained_base)):
        assert np.array_equal(np.asarray(a), np.asarray(b))
    assert state["params"] and all("lora" in k for k in state["params"])
    run_sft(config(tmp_path / "qlora", *lora, "model.lora.quantize=nf4"), log=lambda s: None)
    plain, quant = final_losses(tmp_path / "lora"), final_losses(tmp_path / "qlora")
    assert final_losses(tmp_path / "lora", 60) > plain  # it learned
    assert abs(quant - plain) <= 0.05 * plain


def write_jsonl(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def test_malformed_json_line_exits_2_and_saves_nothing(tmp_path, capsys):
    data = write_jsonl(tmp_path / "bad.jsonl", ['{"text": "fine"}', '{"text": "broken'])
    code = main(["sft", "--config", TINY, f"run_dir={tmp_path / 'run'}", f"data.path={data}"])
    assert code == 2
    err = capsys.readouterr().err
    assert "bad.jsonl" in err and "line 2" in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_missing_field_names_field_and_record(tmp_path, capsys):
    data = write_jsonl(tmp_path / "pc.jsonl", ['{"prompt": "a", "completion": "b"}',
                                               '{"prompt": "c"}'])
    assert main(["sft", "--config", TINY, f"run_dir={tmp_path / 'run'}",
                 f"data.path={data}"]) == 2
    err = capsys.readouterr().err
    assert "pc.jsonl" in err and "completion" in err and "record 1" in err


def test_bad_config_value_names_key_and_choices(tmp_path, capsys):
    assert main(["sft", "--config", TINY, f"run_dir={tmp_path}", "train.schedule=step"]) == 2
    err = capsys.readouterr().err
    assert "train.schedule" in err and "cosine" in err


def test_bad_input_leaves_an_earlier_run_untouched(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["sft", "--config", TINY, f"run_dir={run}", "train.max_steps=20",
                 "log.sinks=[jsonl]", "data.eval_path=null"]) == 0
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    metrics = (run / "metrics.jsonl").read_text()
    bad = write_jsonl(tmp_path / "bad.jsonl", ["not json"])
    assert main(["sft", "--config", TINY, f"run_dir={run}", "train.max_steps=40",
                 "log.sinks=[jsonl]", f"data.path={bad}"]) == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before
    assert (run / "metrics.jsonl").read_text() == metrics


def test_the_sft_loss_over_chunks_of_the_lm_head_is_the_whole_rows_loss():
    """train.head_chunk: the SFT loss and every parameter's gradient from the LM head run over
    chunks of 7 positions (a ragged last chunk) equal those of the whole row's logits (1e-5)."""
    from hone.train.sft_objective import sft_step_loss
    model = hone.load_model("tiny", seed=4)
    rng = np.random.default_rng(0)
    tokens = rng.integers(1, 200, (2, 23)).astype(np.int32)
    mask = np.ones_like(tokens)
    mask[1, 17:] = 0  # right padding
    mb = {"tokens": tokens, "attention_mask": mask, "segment_ids": None,
          "positions": np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32),
          "targets": np.roll(tokens, -1, axis=1), "loss_mask": mask * (rng.random(mask.shape) > 0.3)}

    def loss_and_grads(chunk):
        model.head_chunk = chunk
        graphdef, params = nnx.split(model, nnx.Param)
        loss_of = lambda p: sft_step_loss(nnx.merge(graphdef, p), mb, 10.0, None)[0]  # noqa: E731
        return jax.jit(jax.value_and_grad(loss_of))(params)

    (whole, grads), (chunked, chunk_grads) = loss_and_grads(0), loss_and_grads(7)
    np.testing.assert_allclose(float(chunked), float(whole), rtol=1e-5)
    for a, b in zip(jax.tree.leaves(chunk_grads), jax.tree.leaves(grads)):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5)
