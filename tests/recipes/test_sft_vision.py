"""`hone sft` on a vision-language model: a tiny random Idefics3 saved by transformers, records
with images read from a JSONL file. The training loss of a batch equals transformers' loss on
the same tokens and pixels; a short run learns to name an image's colour; the vision tower stays
as loaded under model.vision.freeze; LoRA lands on the language model only."""

import json

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from vision_reference import colour_images, smolvlm_folder

import hone
from hone.config import SFTConfig, load_config
from hone.data.vision_loader import VisionSFTData, image_settings
from hone.export import export_run
from hone.models.lora import LoRAParam
from hone.recipes.sft import run_sft
from hone.tokenizer import load_tokenizer
from hone.train.build import prepare_for_training
from hone.train.sft_objective import sft_step_loss


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Colour questions: a solid image (a 2 x 2 split of a 64-pixel one, or one frame when it
    fits a tile), its colour the answer; one text-only record."""
    out = tmp_path_factory.mktemp("colours")
    records = []
    for key, image in colour_images(out).items():
        name = key.rstrip("0123456789")
        records.append({"messages": [
            {"role": "user", "content": [{"type": "image"},
                                         {"type": "text", "text": "Colour?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": name}]}],
            "images": [image]})
    records.append({"messages": [{"role": "user", "content": "Hi"},
                                 {"role": "assistant", "content": "Hello"}]})
    path = out / "train.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_settings_and_rows(folder, data):
    settings = image_settings(folder)
    assert (settings.tile, settings.image_seq_len, settings.longest_edge) == (32, 4, 64)
    rows = VisionSFTData(str(data), load_tokenizer(folder), settings=settings, max_length=160,
                         batch_size=4)
    assert rows.num_rows == 7 and rows.frames == 5 and rows.stats.images == 6
    batch = next(rows.iterator())
    assert batch["pixel_values"].shape == (4, 5, 3, 32, 32) and "row" not in batch
    again = rows.iterator()
    again.set_state(rows.iterator().get_state())
    np.testing.assert_array_equal(next(again)["pixel_values"], batch["pixel_values"])


def test_the_training_loss_equals_transformers(folder, data):
    """The SFT objective on a batch with images and a text-only row: transformers' mean
    cross-entropy over the same target tokens, 1e-5."""
    tok = load_tokenizer(folder)
    rows = VisionSFTData(str(data), tok, settings=image_settings(folder), max_length=160,
                         batch_size=7)
    batch = next(rows.batches())
    model = hone.load_model(folder, dtype="float32")
    model.text.head_chunk = 64
    ours = float(nnx.jit(lambda m, b: sft_step_loss(m, b, b["loss_mask"].sum(), None)[0])(
        model, {k: jax.numpy.asarray(v) for k, v in batch.items()}))
    ref = transformers.Idefics3ForConditionalGeneration.from_pretrained(str(folder)).eval()
    labels = np.where(batch["loss_mask"] > 0, batch["targets"], -100)
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor(batch["tokens"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["attention_mask"]),
                     pixel_values=torch.tensor(batch["pixel_values"]),
                     pixel_attention_mask=torch.tensor(batch["pixel_attention_mask"],
                                                       dtype=torch.bool)).logits
        want = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), torch.tensor(labels.reshape(-1)).long(),
            ignore_index=-100)
    assert ours == pytest.approx(float(want), rel=1e-5)


def config(tmp_path, folder, data, *overrides):
    return load_config(SFTConfig, "configs/tiny/sft.yaml", [
        f"run_dir={tmp_path}", f"model.source={folder}", f"data.path={data}",
        f"data.eval_path={data}", "data.max_length=160", "train.batch_size=7",
        "train.max_steps=12", "train.eval_every=12", "train.lr=1e-2", "checkpoint.every_steps=12",
        "log.sinks=[jsonl]", *overrides])


def test_sft_on_images_learns_and_freezes_the_tower(tmp_path, folder, data):
    trained, _ = run_sft(config(tmp_path, folder, data, "model.vision.freeze=true"),
                         log=lambda s: None)
    metrics = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in metrics if "loss" in r]
    assert losses[-1] < 0.5 * losses[0]
    base = hone.load_model(folder, dtype="float32")
    for a, b in zip(jax.tree.leaves(nnx.state(base.vision, nnx.Param)),
                    jax.tree.leaves(nnx.state(trained.vision, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    moved = [not np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(
        jax.tree.leaves(nnx.state(base.connector, nnx.Param)),
        jax.tree.leaves(nnx.state(trained.connector, nnx.Param)))]
    assert all(moved)
    # The run exports as a folder transformers reads, processor files included.
    out = export_run(tmp_path, tmp_path / "export")
    assert image_settings(out) == image_settings(folder)
    ref = transformers.Idefics3ForConditionalGeneration.from_pretrained(str(out)).eval()
    rows = VisionSFTData(str(data), load_tokenizer(out), settings=image_settings(out),
                         max_length=160, batch_size=7)
    batch = next(rows.batches())
    ours = trained(batch["tokens"], attention_mask=batch["attention_mask"],
                   pixel_values=batch["pixel_values"],
                   pixel_attention_mask=batch["pixel_attention_mask"])
    with torch.no_grad():
        want = ref(input_ids=torch.tensor(batch["tokens"], dtype=torch.long),
                   attention_mask=torch.tensor(batch["attention_mask"]),
                   pixel_values=torch.tensor(batch["pixel_values"]),
                   pixel_attention_mask=torch.tensor(batch["pixel_attention_mask"],
                                                     dtype=torch.bool)).logits.numpy()
    real = batch["attention_mask"] > 0
    np.testing.assert_allclose(np.asarray(ours)[real], want[real], rtol=0, atol=1e-4)


@pytest.mark.parametrize("quantize", ["none", "nf4"])
def test_lora_goes_on_the_language_model(tmp_path, folder, data, quantize):
    """The default targets adapt the language model only (QLoRA: its frozen kernels stored in
    nf4); the trainer's settings land on it; a batch with images scores through the adapters."""
    cfg = config(tmp_path, folder, data, "model.lora.rank=4", "train.head_chunk=32",
                 f"model.lora.quantize={quantize}")
    model = hone.load_model(folder, dtype="float32")
    prepare_for_training(model, cfg)
    paths = {"/".join(map(str, p)) for p, _ in nnx.to_flat_state(nnx.state(model, LoRAParam))}
    assert len(paths) == 2 * 7 * 2 and all(p.startswith("text/layers/") for p in paths)
    assert model.head_chunk == 32
    rows = VisionSFTData(str(data), load_tokenizer(folder), settings=image_settings(folder),
                         max_length=160, batch_size=7)
    batch = {k: jax.numpy.asarray(v) for k, v in next(rows.batches()).items()}
    loss = nnx.jit(lambda m, b: sft_step_loss(m, b, b["loss_mask"].sum(), None)[0])(model, batch)
    assert np.isfinite(float(loss))
