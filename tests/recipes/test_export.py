"""`hone export` of a LoRA run: the merged Hugging Face folder and the PEFT adapter both
reproduce the trained model's logits in transformers/peft."""

from pathlib import Path

import numpy as np
import peft
import torch
import transformers

import hone
from hone.cli import main
from hone.export import load_run_model

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4  # fixed; never loosened


def test_export_lora_run_as_hf_and_peft(tmp_path):
    run = tmp_path / "run"
    assert main(["sft", "--config", str(ROOT / "configs/tiny/sft.yaml"), f"run_dir={run}",
                 "train.max_steps=10", "model.lora.rank=4", "train.lr=1e-2",
                 "log.sinks=[jsonl]", "data.eval_path=null"]) == 0
    trained, tok, _ = load_run_model(run)
    tokens = np.random.default_rng(0).integers(0, 256, (2, 12)).astype(np.int32)
    ours = np.asarray(trained(tokens))

    assert main(["export", "--run", str(run), "--out", str(tmp_path / "hf")]) == 0
    merged = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "hf"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = merged(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    assert np.abs(ours - theirs).max() <= TOL
    assert transformers.AutoTokenizer.from_pretrained(str(tmp_path / "hf")).encode("12 + 7") == \
        tok.encode("12 + 7")

    base_dir = hone.save_hf(hone.load_model("tiny"), tmp_path / "base")
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "adapter"),
                 "--format", "peft"]) == 0
    base = transformers.AutoModelForCausalLM.from_pretrained(str(base_dir), dtype=torch.float32)
    adapted = peft.PeftModel.from_pretrained(base, str(tmp_path / "adapter")).eval()
    with torch.no_grad():
        theirs = adapted(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    assert np.abs(ours - theirs).max() <= TOL


def test_export_of_a_full_run_refuses_peft(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["sft", "--config", str(ROOT / "configs/tiny/sft.yaml"), f"run_dir={run}",
                 "train.max_steps=2", "log.sinks=[jsonl]", "data.eval_path=null"]) == 0
    assert main(["export", "--run", str(run), "--out", str(tmp_path / "a"),
                 "--format", "peft"]) == 2
    assert "rank > 0" in capsys.readouterr().err


def test_export_replaces_only_an_earlier_export(tmp_path):
    """An export replaces its folder whole, so it must never take a folder of other things
    (`--out ~`) with it: such a target is refused before anything is written."""
    import pytest

    from hone.errors import InputError
    model = hone.load_model("tiny")
    out = hone.save_hf(model, tmp_path / "export")
    hone.save_hf(model, out)  # an earlier export: replaced
    assert (out / "config.json").exists()
    home = tmp_path / "home"
    (home / "projects").mkdir(parents=True)
    (home / "notes.py").write_text("keep me")
    for target in (home, home / "notes.py"):
        with pytest.raises(InputError, match=str(target)):
            hone.save_hf(model, target)
    assert (home / "notes.py").read_text() == "keep me" and (home / "projects").is_dir()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["export", "home"]  # no temp left
    (home / "projects").rmdir()
    with pytest.raises(InputError, match="notes.py"):
        hone.save_hf(model, home)


def test_export_of_a_kept_step_is_that_steps_model(tmp_path, capsys):
    """`--step S` exports the checkpoint of step S, not the newest: step 2 of a 4-step run (its
    weights as the run saved them at step 2); a step the run did not keep is refused naming the
    kept ones, and --step with --model is refused."""
    from hone.checkpoint import Checkpointer
    assert main(["sft", "--config", str(ROOT / "configs/tiny/sft.yaml"), "log.sinks=[jsonl]",
                 "data.eval_path=null", "checkpoint.every_steps=2", "checkpoint.keep=2",
                 f"run_dir={tmp_path / 'four'}", "train.max_steps=4"]) == 0
    tokens = np.random.default_rng(1).integers(0, 256, (1, 9)).astype(np.int32)
    model, _, _ = load_run_model(tmp_path / "four", step=2)
    ckpt = Checkpointer(tmp_path / "four" / "checkpoints", keep=2, async_save=False)
    saved = ckpt.read(2)[0]["params"]
    ckpt.close()
    assert len(saved) > 5
    for name, value in saved.items():  # every trained array is the step-2 checkpoint's
        leaf = model
        for part in name.split("/"):
            leaf = leaf[int(part)] if part.isdigit() else getattr(leaf, part)
        assert np.array_equal(np.asarray(leaf[...]), np.asarray(value)), name
    two = np.asarray(model(tokens))
    four = np.asarray(load_run_model(tmp_path / "four")[0](tokens))
    assert np.abs(two - four).max() > 1e-3  # the two checkpoints differ
    assert main(["export", "--run", str(tmp_path / "four"), "--out", str(tmp_path / "s2"),
                 "--step", "2"]) == 0
    exported = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path / "s2"), dtype=torch.float32).eval()
    with torch.no_grad():
        theirs = exported(torch.tensor(tokens, dtype=torch.long)).logits.numpy()
    assert np.abs(two - theirs).max() <= TOL
    capsys.readouterr()
    assert main(["export", "--run", str(tmp_path / "four"), "--out", str(tmp_path / "s3"),
                 "--step", "3"]) == 2
    assert "no checkpoint of step 3; it kept 2, 4" in capsys.readouterr().err
    assert not (tmp_path / "s3").exists()
    assert main(["export", "--model", "tiny", "--out", str(tmp_path / "m"), "--step", "2"]) == 2
