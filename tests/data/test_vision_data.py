"""Vision-language SFT records (hone/data/vision.py): images found in every form a record gives
them, placeholders expanded as transformers' Idefics3 processor expands the prompt text, never a
loss on them, never a record cut through an image, errors naming the record and the field, and
the batch a tiny hone Idefics3 model takes."""

import base64
import io
import json

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import HealthCheck, given, settings
from PIL import Image
from vision_reference import vlm_tokenizer

from hone.data.vision import VisionStats, pad_vision_rows, tokenize_vision_sft
from hone.errors import InputError
from hone.models.config import ModelConfig
from hone.models.vision.idefics3 import Idefics3, Idefics3Config, check_image_tokens, real_images
from hone.models.vision.idefics3_processor import (Idefics3ImageSettings, expand_prompt,
                                                   preprocess)
from hone.models.vision.siglip import VisionConfig

# Frames of 16 pixels; the model below: patches of 4 (16 a frame), pixel shuffle 2 -> 4 tokens.
SETTINGS = Idefics3ImageSettings(longest_edge=32, tile=16, image_seq_len=4)


@pytest.fixture(scope="module")
def tok():
    return vlm_tokenizer()


def picture(width, height, seed=0):
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), np.uint8))


def record(*images, question="What is it?", answer="A cat."):
    parts = [{"type": "image"} for _ in images] + [{"type": "text", "text": question}]
    return {"messages": [{"role": "user", "content": parts},
                         {"role": "assistant", "content": [{"type": "text", "text": answer}]}],
            "images": list(images)}


def tokenize(rec, tok, **kw):
    kw.setdefault("settings", SETTINGS)
    return tokenize_vision_sft(rec, tok, **kw)


def test_placeholders_are_the_processors_expansion_and_carry_no_loss(tok):
    wide, large = picture(64, 8, 1), picture(40, 28, 2)  # 1 x 2 crops + global; 2 x 2 + global
    rec = record(wide, large)
    ex = tokenize(rec, tok)
    text = tok.apply_chat_template(rec["messages"], add_generation_prompt=False)
    got = preprocess([[wide, large]], SETTINGS)
    assert got["grids"] == [[(1, 2), (2, 2)]]
    want = tok.encode(expand_prompt(text, got["grids"][0], SETTINGS.image_seq_len),
                      add_special_tokens=False)
    assert ex.tokens.tolist() == want  # splicing ids = tokenizing the expanded text at once
    image_id = tok.encode("<image>", add_special_tokens=False)[0]
    assert (ex.tokens == image_id).sum() == 8 * SETTINGS.image_seq_len  # (2 + 1) + (4 + 1)
    trained = tok.decode(ex.tokens[ex.loss_mask].tolist())
    assert trained == "A cat.<end_of_utterance>"  # the answer and its end of turn, nothing else
    assert ex.images == 2 and ex.frames.shape == (8, 3, 16, 16)
    np.testing.assert_array_equal(ex.sizes, [[16, 16]] * 8)
    np.testing.assert_array_equal(ex.frames, got["pixel_values"][0])
    unsplit = Idefics3ImageSettings(longest_edge=32, tile=16, image_seq_len=4, split=False)
    one = tokenize(rec, tok, settings=unsplit)
    assert one.frames.shape == (2, 3, 16, 16) and (one.tokens == image_id).sum() == 8
    np.testing.assert_array_equal(one.frames, preprocess([[wide, large]], unsplit)["pixel_values"][0])


def test_every_form_of_image_gives_the_same_frames(tok, tmp_path):
    image = picture(20, 14, 3)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    raw = buf.getvalue()
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(raw)
    b64 = base64.b64encode(raw).decode()
    forms = ["img/a.png", str(tmp_path / "img" / "a.png"), f"data:image/png;base64,{b64}",
             {"path": "img/a.png"}, {"bytes": b64}, {"bytes": raw}, raw, image]
    frames = [tokenize(record(form), tok, base_dir=tmp_path).frames for form in forms]
    for f in frames[1:]:
        np.testing.assert_array_equal(f, frames[0])
    inline = {"messages": [{"role": "user", "content": [
        {"type": "image", "image": "img/a.png"}, {"type": "text", "text": "?"}]},
        {"role": "assistant", "content": "Yes."}]}
    np.testing.assert_array_equal(tokenize(inline, tok, base_dir=tmp_path).frames, frames[0])


def test_text_only_records_mix_in(tok):
    rec = {"messages": [{"role": "user", "content": "Hi"},
                        {"role": "assistant", "content": "Hello."}]}
    ex = tokenize(rec, tok)
    assert ex.images == 0 and ex.frames.shape[0] == 0
    assert tok.decode(ex.tokens[ex.loss_mask].tolist()) == "Hello.<end_of_utterance>"


@pytest.mark.parametrize("change, key, words", [
    (lambda r: r.update(images=["missing.png"]), "images[0]", "not found"),
    (lambda r: r.update(images=[]), "images", "0 image(s) for 1"),
    (lambda r: r.update(images=[{"bytes": "***"}]), "images[0]", "base64"),
    (lambda r: r.update(images=[b"not a png"]), "images[0]", "not a readable image"),
    (lambda r: r.update(images=[7]), "images[0]", "got int"),
    (lambda r: r["messages"][0]["content"].append({"type": "video"}), "messages[0].content[2].type",
     "content part"),
    (lambda r: r["messages"][0].update(content=3), "messages[0].content", "got int"),
])
def test_bad_records_name_the_record_and_field(tok, tmp_path, change, key, words):
    rec = record(picture(8, 8))
    change(rec)
    with pytest.raises(InputError) as err:
        tokenize(rec, tok, base_dir=tmp_path, path="data.jsonl", index=5)
    assert err.value.key == key and "record 5" in str(err.value) and words in str(err.value)
    assert "data.jsonl" in str(err.value)


def test_no_record_is_cut_through_an_image(tok):
    rec = record(picture(40, 28, 2), answer="A long answer. " * 4)  # 5 frames: 20 + tags
    full = tokenize(rec, tok)
    image_id = tok.encode("<image>", add_special_tokens=False)[0]
    last_image = int(np.flatnonzero(full.tokens == image_id)[-1])
    stats = VisionStats()
    # A cut after every image's placeholders: truncated like a text record.
    cut = tokenize(rec, tok, max_length=len(full) - 5, stats=stats, index=3)
    assert cut.tokens.tolist() == full.tokens[:len(full) - 5].tolist() and stats.truncated == 1
    # A cut through the image: dropped, counted, its index kept; or an error naming it.
    assert tokenize(rec, tok, max_length=last_image, stats=stats, index=4) is None
    assert stats.dropped_image_cut == 1 and stats.dropped_records == [4]
    assert tokenize(rec, tok, max_length=last_image, overlong="drop", stats=stats, index=6) is None
    assert stats.dropped_overlong == 1 and stats.dropped_records == [4, 6]
    with pytest.raises(InputError, match="record 9: .* over data.max_length"):
        tokenize(rec, tok, max_length=last_image, overlong="error", index=9)
    # Too many frames for a batch row: the same policy.
    assert tokenize(rec, tok, max_frames=4, stats=stats, index=7) is None
    assert stats.dropped_records == [4, 6, 7]
    with pytest.raises(InputError, match="5 frames, over data.max_frames 4"):
        tokenize(rec, tok, max_frames=4, overlong="error")
    assert stats.as_dict()["dropped_image_cut"] == 2 and "dropped_records" not in stats.as_dict()


def test_a_batch_feeds_the_model(tok):
    """Rows of pad_vision_rows through a tiny hone Idefics3 whose frames are the settings' tiles:
    the placeholders of each row match its frames (the model checks per row) and the images
    change the logits of the text after them."""
    examples = [tokenize(record(picture(64, 8, 1), picture(40, 28, 2)), tok),
                tokenize({"messages": [{"role": "user", "content": "Hi"},
                                       {"role": "assistant", "content": "Hello."}]}, tok),
                tokenize(record(picture(16, 16, 4)), tok)]
    rows = pad_vision_rows(examples, 160, tok.pad_id, frames=8, tile=16)
    assert rows["pixel_values"].shape == (3, 8, 3, 16, 16)
    assert rows["pixel_attention_mask"][0].sum() == 8 * 16 * 16
    assert rows["pixel_attention_mask"][1].sum() == 0  # text only: all padding frames
    assert rows["pixel_attention_mask"][2, :5].all() and not rows["pixel_attention_mask"][2, 5:].any()
    image_id = tok.encode("<image>", add_special_tokens=False)[0]
    text = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64,
                       num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                       max_position_embeddings=256)
    cfg = Idefics3Config(vision=VisionConfig(image_size=16, patch_size=4), text=text,
                         scale_factor=2, image_token_id=image_id)
    model = Idefics3(cfg, rngs=nnx.Rngs(0))
    check_image_tokens(rows["tokens"] == image_id, real_images(rows["pixel_values"]),
                       model.tokens_per_image(rows["pixel_values"]), image_id)  # per row

    @nnx.jit
    def forward(model, pixels):  # jitted: eager, each operation compiles on its own (seconds)
        return model(rows["tokens"], attention_mask=rows["attention_mask"], pixel_values=pixels,
                     pixel_attention_mask=rows["pixel_attention_mask"])

    pixels = jnp.asarray(rows["pixel_values"])
    logits, blank = forward(model, pixels), forward(model, pixels.at[0].multiply(0.5))
    end = len(examples[0]) - 1
    assert np.abs(np.asarray(logits[0, end] - blank[0, end])).max() > 1e-4
    np.testing.assert_array_equal(np.asarray(logits[1]), np.asarray(blank[1]))


def test_the_stats_serialise(tok):
    stats = VisionStats()
    tokenize(record(picture(8, 8)), tok, stats=stats)
    assert json.loads(json.dumps(stats.as_dict()))["images"] == 1 and stats.frames == 5  # 2 x 2 + 1


part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=5)}),
    st.fixed_dictionaries({"type": st.just("image")}),
    st.dictionaries(st.sampled_from(["type", "text", "image"]),
                    st.one_of(st.none(), st.integers(), st.text(max_size=3)), max_size=2))
message = st.fixed_dictionaries({
    "role": st.sampled_from(["user", "assistant", "system", "robot"]),
    "content": st.one_of(st.text(max_size=5), st.lists(part, max_size=3), st.integers())})


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(messages=st.lists(message, max_size=4), n_images=st.integers(0, 3))
def test_any_record_is_an_example_or_an_input_error(tok, messages, n_images):
    rec = {"messages": messages, "images": [picture(8, 8, k) for k in range(n_images)]}
    image_id = tok.encode("<image>", add_special_tokens=False)[0]
    try:
        ex = tokenize(rec, tok)
    except InputError as err:
        assert "record 0" in str(err)
        return
    if ex is not None:
        assert (ex.tokens == image_id).sum() == SETTINGS.image_seq_len * len(ex.frames)
        assert not ex.loss_mask[ex.tokens == image_id].any()
