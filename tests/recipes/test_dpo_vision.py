"""`hone dpo` on a vision-language model: preference pairs whose prompts carry an image (the
tiny random Idefics3 of tests/vision_reference.py). The policy's completion log-probabilities
in both batch layouts equal transformers' on the same tokens and pixels; a short run learns to
prefer the image's colour; a pair is never cut through its image."""

import json

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from vision_reference import colour_images, smolvlm_folder

import hone
from hone.config import DPOConfig, load_config
from hone.data.vision_loader import image_settings
from hone.data.vision_pairs import VisionPairStats, VisionPreferenceData, tokenize_vision_pair
from hone.errors import InputError
from hone.recipes.dpo import run_dpo
from hone.tokenizer import load_tokenizer
from hone.train.dpo_objective import sequence_logps

NAMES = ["red", "green", "blue"]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return smolvlm_folder(tmp_path_factory.mktemp("smolvlm"))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Which colour is the image: the right name chosen, the next one rejected; one text-only
    pair."""
    out = tmp_path_factory.mktemp("colour_pairs")
    records = []
    for key, image in colour_images(out).items():
        name = key.rstrip("0123456789")
        wrong = NAMES[(NAMES.index(name) + 1) % 3]
        records.append({"prompt": [{"role": "user", "content": [
            {"type": "image"}, {"type": "text", "text": "Colour?"}]}],
            "images": [image], "chosen": name, "rejected": wrong})
    records.append({"prompt": [{"role": "user", "content": "Hi"}], "chosen": "Hello",
                    "rejected": "Go away"})
    path = out / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def reference_logps(folder, batch) -> np.ndarray:
    """transformers' summed completion log-probs of the [2B, L] rows (loss_mask targets)."""
    ref = transformers.Idefics3ForConditionalGeneration.from_pretrained(str(folder)).eval()
    with torch.no_grad():
        logits = ref(input_ids=torch.tensor(batch["tokens"], dtype=torch.long),
                     attention_mask=torch.tensor(batch["attention_mask"]),
                     position_ids=torch.tensor(batch["positions"], dtype=torch.long),
                     pixel_values=torch.tensor(batch["pixel_values"]),
                     pixel_attention_mask=torch.tensor(batch["pixel_attention_mask"],
                                                       dtype=torch.bool)).logits
    logp = torch.log_softmax(logits.double(), -1)
    picked = torch.gather(logp, -1, torch.tensor(batch["targets"], dtype=torch.long)[..., None])
    return (picked[..., 0].numpy() * batch["loss_mask"]).sum(-1)


def test_completion_logprobs_equal_transformers_in_both_layouts(folder, data):
    tok, settings = load_tokenizer(folder), image_settings(folder)
    model = hone.load_model(folder, dtype="float32")
    model.text.head_chunk = 64
    score = nnx.jit(lambda m, b: sequence_logps(m, b)[0])
    got = {}
    for shared in (False, True):
        pairs = VisionPreferenceData(str(data), tok, settings=settings, max_length=96,
                                     batch_size=7, shared_prompt=shared)
        assert pairs.num_pairs == 7 and pairs.frames == 5 and pairs.stats.images == 6
        batch = next(pairs.batches())
        got[shared] = np.asarray(score(model, {k: jax.numpy.asarray(v)
                                               for k, v in batch.items()}))
        if not shared:
            assert batch["pixel_values"].shape == (14, 5, 3, 32, 32)
            np.testing.assert_array_equal(batch["pixel_values"][:7], batch["pixel_values"][7:])
            want = reference_logps(folder, batch)
    np.testing.assert_allclose(got[False], want, rtol=1e-5)
    np.testing.assert_allclose(got[True], got[False], rtol=1e-5)


def test_a_pair_is_never_cut_through_its_image(folder, data):
    tok, settings = load_tokenizer(folder), image_settings(folder)
    record = json.loads(data.read_text().splitlines()[1])  # red, 50 pixels: 5 frames
    full = tokenize_vision_pair(record, tok, settings=settings, base_dir=data.parent)
    room = len(full.prompt) + 1  # the whole prompt and one completion token
    stats = VisionPairStats()
    cut = tokenize_vision_pair(record, tok, settings=settings, base_dir=data.parent,
                               max_length=room, stats=stats)
    assert cut.prompt.tolist() == full.prompt.tolist() and len(cut.chosen) == 1
    assert stats.truncated == 1
    assert tokenize_vision_pair(record, tok, settings=settings, base_dir=data.parent,
                                max_length=room - 1, stats=stats, index=4) is None
    assert stats.dropped_image_cut == 1 and stats.dropped_records == [4]
    with pytest.raises(InputError, match="record 2: .* never cut through an image"):
        tokenize_vision_pair(record, tok, settings=settings, base_dir=data.parent,
                             max_length=room - 1, overlong="error", index=2)


def test_dpo_on_images_learns_to_prefer_the_colour(tmp_path, folder, data):
    cfg = load_config(DPOConfig, "configs/tiny/dpo.yaml", [
        f"run_dir={tmp_path}", f"model.source={folder}", f"data.path={data}",
        f"data.eval_path={data}", "data.max_length=96", "train.batch_size=7",
        "train.max_steps=10", "train.eval_every=10", "train.lr=1e-2",
        "checkpoint.every_steps=10", "log.sinks=[jsonl]", "dpo.shared_prompt=true"])
    run_dpo(cfg, log=lambda s: None)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if "eval_accuracy" in r][-1]
    assert last["eval_accuracy"] == 1.0 and last["eval_margin"] > 0.5
