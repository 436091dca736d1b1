"""Idefics3 / SmolVLM out as Hugging Face folders and PEFT adapters.

The tiny random model of test_idefics3.py (saved by transformers, loaded by hone) goes back out
through `hone export --model` and `hone.save_hf`; transformers' Idefics3ForConditionalGeneration
loads the folder and must give the original model's logits on the mixed batch (two images
with one padded, a left-padded one-image row, a right-padded text-only row). Adapters that hone
puts on the text model, the vision tower and the connector export as PEFT, which must load them
onto transformers' model under its module names and give hone's adapted logits.
"""

import json

import jax
import numpy as np
import peft
import pytest
import tokenizers
import torch
import transformers
from flax import nnx
from reference import max_diff_on_real_tokens
from safetensors.numpy import load_file
from test_idefics3 import TOL, batch, build, forward, hf_logits

import hone
from hone.cli import main
from hone.errors import InputError
from hone.models.lora import apply_lora, lora_modules, merge_lora
from hone.weights.peft import save_peft


@pytest.fixture(scope="module")
def original(tmp_path_factory):
    """(transformers' model, its folder, hone's model of it)."""
    root = tmp_path_factory.mktemp("idefics3_export")
    ref, model = build(root)
    return ref, root / "untied", model


def word_tokenizer(folder):
    """A word-level tokenizer of the model's 97 ids written into `folder`: <unk> <s> </s>
    <pad>, words w4..w94, then the two image tokens (95, 96)."""
    words = ["<unk>", "<s>", "</s>", "<pad>"] + [f"w{i}" for i in range(4, 95)]
    vocab = {w: i for i, w in enumerate(words + ["<fake_token_around_image>", "<image>"])}
    backend = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(["<unk>", "<s>", "</s>", "<pad>"])
    backend.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>",
         "tokenizer_class": "PreTrainedTokenizerFast"}))


def load_hf(folder):
    model = transformers.Idefics3ForConditionalGeneration.from_pretrained(
        str(folder), dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def test_hone_export_round_trip(original, tmp_path):
    """transformers -> hone.load_model -> `hone export` -> transformers: the same logits, the
    same tensor names, the same config where it matters."""
    ref, folder, model = original
    word_tokenizer(folder)  # `hone export --model` carries the tokenizer over
    out = tmp_path / "out"
    assert main(["export", "--model", str(folder), "--out", str(out)]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["Idefics3ForConditionalGeneration"]
    assert (config["image_token_id"], config["scale_factor"]) == (96, 2)
    assert config["tie_word_embeddings"] is False
    assert config["vision_config"]["model_type"] == "idefics3_vision"
    assert [config["text_config"][f"{t}_token_id"] for t in ("bos", "eos", "pad")] == [1, 2, 3]
    assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == 2
    assert hone.load_tokenizer(out).encode("w5 <image> w7") == [5, 96, 7]
    assert sorted(load_file(out / "model.safetensors")) == sorted(
        load_file(folder / "model.safetensors"))

    back = load_hf(out)
    ids, mask, pixels, pmask = batch()
    theirs = hf_logits(ref, ids, mask, pixels, pmask)
    assert max_diff_on_real_tokens(hf_logits(back, ids, mask, pixels, pmask), theirs,
                                   mask) <= TOL
    assert max_diff_on_real_tokens(forward(model, ids, mask, pixels, pmask), theirs,
                                   mask) <= TOL
    assert main(["export", "--model", str(folder), "--out", str(tmp_path / "m.gguf"),
                 "--format", "gguf"]) == 2  # GGUF holds text models only: refused, by name
    for key in ("text_config", "vision_config"):  # every architecture field read back
        ours, orig = back.config.to_dict()[key], ref.config.to_dict()[key]
        for field in ("hidden_size", "intermediate_size", "num_hidden_layers",
                      "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                      "vocab_size", "rope_parameters", "image_size", "patch_size",
                      "layer_norm_eps", "hidden_act", "num_channels"):
            assert ours.get(field) == orig.get(field), (key, field)


def test_tied_export_in_bfloat16(tmp_path):
    """Tied embeddings stay tied (no lm_head tensor; transformers ties on loading); a bfloat16
    folder holds the bfloat16-rounded weights."""
    ref, model = build(tmp_path, tie=True)
    out = hone.save_hf(model, tmp_path / "out")
    assert "lm_head.weight" not in load_file(out / "model.safetensors")
    back = load_hf(out)
    ids, mask, pixels, pmask = batch(seed=3)
    theirs = hf_logits(ref, ids, mask, pixels, pmask)
    assert max_diff_on_real_tokens(hf_logits(back, ids, mask, pixels, pmask), theirs,
                                   mask) <= TOL
    half = hone.save_hf(model, tmp_path / "bf16", dtype="bfloat16")
    assert json.loads((half / "config.json").read_text())["text_config"]["dtype"] == "bfloat16"
    rounded = hone.load_model(half, dtype="float32")
    emb = np.asarray(model.text.embedder.embedding[...])
    assert np.array_equal(np.asarray(rounded.text.embedder.embedding[...]),
                          emb.astype(jax.numpy.bfloat16).astype(np.float32))


def randomize_b(model, seed=1, std=0.3):
    """Every adapter a non-zero B, so the update shows in the logits."""
    key = jax.random.key(seed)
    for lin in lora_modules(model).values():
        key, sub = jax.random.split(key)
        lin.lora.lora_b[...] = std * jax.random.normal(sub, lin.lora.lora_b.shape)


def test_peft_export_of_text_vision_and_connector_adapters(original, tmp_path):
    ref, folder, base = original
    model = nnx.clone(base)
    targets = r"text/layers/\d+/(attn/.|mlp/down)|text/lm_head|vision/layers/1/attn/(q|o)" \
              r"|vision/layers/0/mlp/fc1|connector/proj"
    apply_lora(model, rank=4, alpha=8.0, targets=targets, rngs=nnx.Rngs(3))
    randomize_b(model)
    ids, mask, pixels, pmask = batch(seed=1)
    ours = forward(model, ids, mask, pixels, pmask)
    plain = hf_logits(ref, ids, mask, pixels, pmask)
    assert max_diff_on_real_tokens(ours, plain, mask) > 1e3 * TOL  # the adapters matter

    adapter = save_peft(model, tmp_path / "adapter", base_model_name_or_path=str(folder))
    config = json.loads((adapter / "adapter_config.json").read_text())
    # q_proj names both towers' projections, so PEFT gets exact module names, not leaves.
    assert isinstance(config["target_modules"], str)
    assert "model\\.text_model\\.layers\\.0\\.self_attn\\.q_proj" in config["target_modules"]
    adapted = peft.PeftModel.from_pretrained(load_hf(folder), str(adapter)).eval()
    injected = {n.removesuffix(".lora_A") for n, _ in adapted.named_modules()
                if n.endswith(".lora_A")}
    assert len(injected) == len(lora_modules(model)) == 15
    assert max_diff_on_real_tokens(hf_logits(adapted, ids, mask, pixels, pmask), ours,
                                   mask) <= TOL

    merged = load_hf(hone.save_hf(merge_lora(model), tmp_path / "merged"))
    assert max_diff_on_real_tokens(hf_logits(merged, ids, mask, pixels, pmask), ours,
                                   mask) <= TOL


def test_text_only_adapters_stay_on_the_text_model(original, tmp_path):
    """Adapters on the language model only: still exact module names, since transformers'
    vision tower has q_proj / v_proj too (leaf names would put adapters there)."""
    ref, folder, base = original
    model = nnx.clone(base)
    apply_lora(model, rank=2, alpha=4.0, targets=r"text/layers/\d+/attn/(q|v)",
               rngs=nnx.Rngs(4))
    randomize_b(model, seed=2)
    adapter = save_peft(model, tmp_path / "adapter", base_model_name_or_path=str(folder))
    adapted = peft.PeftModel.from_pretrained(load_hf(folder), str(adapter)).eval()
    injected = sorted(n.removesuffix(".lora_A") for n, _ in adapted.named_modules()
                      if n.endswith(".lora_A"))
    assert len(injected) == 4 and all(".text_model." in n for n in injected)
    config = json.loads((adapter / "adapter_config.json").read_text())
    assert isinstance(config["target_modules"], str)  # a regex of exact names
    ids, mask, pixels, pmask = batch(seed=2)
    assert max_diff_on_real_tokens(hf_logits(adapted, ids, mask, pixels, pmask),
                                   forward(model, ids, mask, pixels, pmask), mask) <= TOL


def test_unexportable_adapters_are_refused(original, tmp_path):
    _, folder, base = original
    model = nnx.clone(base)
    apply_lora(model, rank=2, alpha=4.0, targets=r"vision/patch", rngs=nnx.Rngs(5))
    with pytest.raises(InputError, match="vision/patch has adapters but no PEFT module"):
        save_peft(model, tmp_path / "adapter", base_model_name_or_path=str(folder))
    with pytest.raises(InputError, match="merge them first"):
        hone.save_hf(model, tmp_path / "merged")
    assert not (tmp_path / "adapter").exists() and not (tmp_path / "merged").exists()
