"""Gemma 3 vision against transformers' Gemma3ForConditionalGeneration.

One tiny random model (SigLIP tower 32 wide over 8 x 8 patches of 4 pixels, 4 x 4 average pool
into 4 soft tokens per image, RMSNorm and projection; a 3-layer Gemma 3 text model with two
sliding layers of window 3, shorter than an image block, so a block straddles the window, then
a full layer), every weight randomised, saved with save_pretrained and loaded with
hone.load_model. The batch mixes a record with two images, a left-padded record with one image
and a right-padded text-only record. Logits must match in float32 at test_idefics3.py's
tolerance, with and without token_type_ids (the bidirectional image blocks).
"""

import dataclasses

import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from reference import max_diff_on_real_tokens, randomize
from safetensors.numpy import load_file, save_file

import hone
from hone.errors import InputError
from hone.models.masks import make_mask
from hone.models.vision.gemma3 import Gemma3Vision, image_blocks

IMAGE, BOI, EOI = 100, 98, 99  # <image_soft_token>, <start_of_image>, <end_of_image>
PER_IMAGE = 4  # mm_tokens_per_image: the 8 x 8 patch grid pooled 4 x 4
# Fixed, never loosened (test_idefics3.py's). The largest difference measured was 4.7e-6 on
# logits of size 6.8; the text-only rows alone differ by 3.8e-6 (the Gemma 3 text model's
# float32 rounding), the image features by 7e-7.
TOL = 1e-5


def forward(model, ids, mask, pixels=None, types=None):
    """hone's logits, jitted (one compile instead of one per operation: seconds here)."""
    return np.asarray(_jitted(model, ids, mask, pixels, types))


@nnx.jit
def _jitted(model, ids, mask, pixels, types):
    return model(ids, attention_mask=mask, pixel_values=pixels, token_type_ids=types)


def hf_config(tie: bool = True):
    return transformers.Gemma3Config(
        vision_config=dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, image_size=32, patch_size=4),
        text_config=dict(vocab_size=101, hidden_size=48, intermediate_size=80,
                         num_hidden_layers=3, num_attention_heads=2, num_key_value_heads=1,
                         head_dim=16, query_pre_attn_scalar=16, sliding_window=3,
                         max_position_embeddings=64,
                         layer_types=["sliding_attention", "sliding_attention",
                                      "full_attention"]),
        mm_tokens_per_image=PER_IMAGE, image_token_index=IMAGE, boi_token_index=BOI,
        eoi_token_index=EOI, tie_word_embeddings=tie)


def build(folder, tie: bool = True):
    config = hf_config(tie)
    for c in (config, config.vision_config, config.text_config):
        c._attn_implementation = "eager"
    torch.manual_seed(0)
    ref = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32)
    randomize(ref)
    ref.eval()
    ref.save_pretrained(str(folder))
    return ref, hone.load_model(folder, dtype="float32")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build(tmp_path_factory.mktemp("gemma3") / "tied")


def image_run() -> list[int]:
    return [BOI] + [IMAGE] * PER_IMAGE + [EOI]


def batch(seed: int = 0):
    """input_ids [3, T], attention_mask, pixel_values [3, 3, 32, 32] (row 0's two images, then
    row 1's), token_type_ids: row 0 has two images, row 1 one and left padding, row 2 none and
    right padding."""
    rng = np.random.default_rng(seed)
    text = lambda n: list(rng.integers(0, BOI, n))  # noqa: E731
    rows = [text(2) + image_run() + text(1) + image_run() + text(2),
            text(3) + image_run() + text(4),
            text(9)]
    t = max(map(len, rows))
    ids = np.zeros((3, t), np.int32)
    mask = np.zeros((3, t), np.int32)
    ids[0], mask[0] = rows[0], 1
    ids[1, t - len(rows[1]):], mask[1, t - len(rows[1]):] = rows[1], 1  # left padded
    ids[2, :len(rows[2])], mask[2, :len(rows[2])] = rows[2], 1  # right padded
    pixels = rng.normal(size=(3, 3, 32, 32)).astype(np.float32)
    return ids, mask, pixels, (ids == IMAGE).astype(np.int32)


def hf_logits(ref, ids, mask, pixels=None, types=None):
    kw = {}
    if pixels is not None:
        kw["pixel_values"] = torch.tensor(pixels)
    if types is not None:
        kw["token_type_ids"] = torch.tensor(types, dtype=torch.long)
    positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(ids, dtype=torch.long),
                  attention_mask=torch.tensor(mask),
                  position_ids=torch.tensor(positions, dtype=torch.long), **kw)
    return out.logits.float().numpy()


def test_loads_as_gemma3(models):
    _, model = models
    assert isinstance(model, Gemma3Vision)
    cfg = model.config
    assert cfg.image_token_id == IMAGE and cfg.mm_tokens_per_image == PER_IMAGE
    assert cfg.pool == 4 and cfg.vision.patches_per_side == 8
    assert cfg.text.family == "gemma3_text" and cfg.text.sliding_window == 3
    assert cfg.text.layer_types == ("sliding", "sliding", "global")
    assert cfg.text.tie_embeddings and model.text.lm_head is None


def test_logits_match_transformers(models):
    ref, model = models
    ids, mask, pixels, types = batch()
    theirs = hf_logits(ref, ids, mask, pixels, types)
    assert max_diff_on_real_tokens(forward(model, ids, mask, pixels, types), theirs,
                                   mask) <= TOL
    # Without token_type_ids transformers is causal everywhere, as hone is with no image token
    # marked (the same compiled program): still equal, and not what the bidirectional blocks
    # give, so the comparison above tests the mask.
    causal = hf_logits(ref, ids, mask, pixels)
    unmarked = forward(model, ids, mask, pixels, np.zeros_like(types))
    assert max_diff_on_real_tokens(unmarked, causal, mask) <= TOL
    assert max_diff_on_real_tokens(causal, theirs, mask) > 1e3 * TOL
    # And the images change the logits.
    assert max_diff_on_real_tokens(hf_logits(ref, ids, mask), theirs, mask) > 1e3 * TOL


def test_without_images_is_the_text_model(models):
    ref, model = models
    ids, mask, _, _ = batch(seed=2)
    ids[ids == IMAGE] = 7  # text only
    ours = forward(model, ids, mask)
    text = nnx.jit(lambda m, ids, mask: m(ids, attention_mask=mask))(model.text, ids, mask)
    assert np.array_equal(ours, np.asarray(text))
    assert max_diff_on_real_tokens(ours, hf_logits(ref, ids, mask), mask) <= TOL


def test_image_block_mask_by_hand():
    """Tokens 1-3 one image, token 5 another (token 4 text), window 2, token 6 padding: causal
    and windowed, except that an image token also sees its own block's later tokens."""
    types = np.array([[0, 1, 1, 1, 0, 1, 0]])
    assert np.asarray(image_blocks(types)).tolist() == [[0, 1, 1, 1, 0, 2, 0]]
    slots = np.arange(7)[None]
    valid = np.array([[1, 1, 1, 1, 1, 1, 0]], bool)
    blocks = image_blocks(types)
    mask = np.asarray(make_mask(slots, slots, valid, 2, q_bidirectional=blocks,
                                k_bidirectional=blocks))[0].astype(int)
    assert mask.tolist() == [[1, 0, 0, 0, 0, 0, 0],
                             [1, 1, 1, 1, 0, 0, 0],
                             [0, 1, 1, 1, 0, 0, 0],
                             [0, 0, 1, 1, 0, 0, 0],  # the window hides the block's first token
                             [0, 0, 0, 1, 1, 0, 0],
                             [0, 0, 0, 0, 1, 1, 0],
                             [0, 0, 0, 0, 0, 1, 0]]  # a padding query sees only keys before it
    plain = np.asarray(make_mask(slots, slots, valid, 2))[0].astype(int)
    assert (plain == np.tril(mask)).all()


def test_a_later_image_token_reaches_an_earlier_one(models):
    """Inside a block the mask is bidirectional: changing the embedding of an image block's last
    token changes its first token's output (on the sliding layers too, where the window is
    shorter than the block), and nothing before the block; without the blocks it changes
    nothing before itself."""
    _, model = models
    ids, mask, _, types = batch()
    embeds = np.asarray(model.text.embedder.encode(ids))
    first = int(np.nonzero(types[0])[0][0])
    last = first + PER_IMAGE - 1
    moved = embeds.copy()
    moved[0, last] += 1.0

    @nnx.jit
    def hidden(model, embeds, blocks):
        return model.text.hidden(ids, attention_mask=mask, embeds=embeds,
                                 bidirectional_ids=blocks)

    blocks = image_blocks(types)
    change = np.abs(hidden(model, moved, blocks) - hidden(model, embeds, blocks)).max(-1)[0]
    assert (change[first:last] > 1e-3).all()
    assert (change[:first] == 0).all()
    none = image_blocks(np.zeros_like(types))  # no block: causal (one compiled program)
    causal = np.abs(hidden(model, moved, none) - hidden(model, embeds, none)).max(-1)[0]
    assert (causal[:last] == 0).all() and causal[last] > 1e-3


def test_blockwise_attention_keeps_the_blocks(models):
    """The blockwise path (blocks of 6 queries and keys, so every image block crosses two and
    a query block needs the key block after it) equals the dense one."""
    _, model = models
    ids, mask, pixels, types = batch()
    dense = forward(model, ids, mask, pixels, types)
    model.text.attention, model.text.attention_block = "blockwise", 6
    try:
        blockwise = forward(model, ids, mask, pixels, types)
    finally:
        model.text.attention, model.text.attention_block = "auto", 256
    assert max_diff_on_real_tokens(blockwise, dense, mask) <= TOL


def test_image_tokens_that_do_not_match_the_images_are_refused(models):
    _, model = models
    ids, mask, pixels, types = batch()
    cut = ids.copy()
    cut[0, np.nonzero(ids[0] == IMAGE)[0][-1]] = 5  # one placeholder of row 0 lost
    with pytest.raises(InputError, match="Image features and image tokens do not match: row 0 "
                                         "has 7 image tokens"):
        model(cut, attention_mask=mask, pixel_values=pixels, token_type_ids=types)
    with pytest.raises(InputError, match="the batch has 12 image tokens .* but 2 images"):
        model(ids, attention_mask=mask, pixel_values=pixels[:2], token_type_ids=types)
    with pytest.raises(InputError, match=r"expected images \[N, C, 32, 32\]"):
        model(ids, attention_mask=mask, pixel_values=pixels[..., :16], token_type_ids=types)


def test_every_tensor_layout_loads_untied(models, tmp_path):
    """Untied, saved by transformers (`language_model.model.*`, `vision_tower.*`), then the same
    tensors under the Hub's names (`vision_tower.vision_model.*`) and under transformers 5's
    module names (`model.language_model.*`, `lm_head.weight`): the same logits, transformers'."""
    ref, model = build(tmp_path / "untied", tie=False)
    assert model.text.lm_head is not None
    ids, mask, pixels, types = batch(seed=3)
    ours = forward(model, ids, mask, pixels, types)
    assert max_diff_on_real_tokens(ours, hf_logits(ref, ids, mask, pixels, types), mask) <= TOL
    saved = load_file(str(tmp_path / "untied" / "model.safetensors"))
    renames = {"hub": (("vision_tower.", "vision_tower.vision_model."),),
               "modules": (("language_model.model.", "model.language_model."),
                           ("language_model.lm_head.", "lm_head."),
                           ("vision_tower.", "model.vision_tower."),
                           ("multi_modal_projector.", "model.multi_modal_projector."))}
    for layout, rules in renames.items():
        folder = tmp_path / layout
        folder.mkdir()
        (folder / "config.json").write_text((tmp_path / "untied" / "config.json").read_text())
        tensors = {}
        for name, x in saved.items():
            old, new = next(((o, n) for o, n in rules if name.startswith(o)), ("", ""))
            tensors[new + name.removeprefix(old)] = x
        save_file(tensors, str(folder / "model.safetensors"))
        again = hone.load_model(folder, dtype="float32")
        assert np.array_equal(forward(again, ids, mask, pixels, types), ours), layout
    assert dataclasses.asdict(again.config) == dataclasses.asdict(model.config)
