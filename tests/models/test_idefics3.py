"""Idefics3 / SmolVLM against transformers' Idefics3ForConditionalGeneration.

One tiny random model (SigLIP-style tower 32 wide over 4 x 4 patches of 8 pixels, pixel shuffle
by 2 into 4 tokens per image, a 2-layer Llama with GQA), every weight randomised, saved with
save_pretrained and loaded with hone.load_model. The batch mixes a record with two images (one
padded: only part of its pixels real), a left-padded record with one image, and a right-padded
text-only record. Logits must match in float32 at the text models' fixed tolerance.
"""

import jax
import numpy as np
import pytest
import torch
import transformers
from flax import nnx
from reference import max_diff_on_real_tokens
from vision_reference import FAKE, IMAGE, PER_IMAGE, build_idefics3, idefics3_config

from hone.errors import InputError
from hone.models.vision.idefics3 import Idefics3
from hone.models.vision.siglip import bucket_boundaries, fractional_position_ids

# Fixed, never loosened; tighter than the text families' 1e-4 (reference.TOL): the largest
# difference measured was 6e-7 on logits of size 1.5.
TOL = 1e-5


def forward(model, ids, mask, pixels=None, pmask=None):
    """hone's logits, jitted (one compile instead of one per operation: seconds here)."""
    return np.asarray(_jitted(model, ids, mask, pixels, pmask))


@nnx.jit
def _jitted(model, ids, mask, pixels, pmask):
    return model(ids, attention_mask=mask, pixel_values=pixels, pixel_attention_mask=pmask)


def hf_config(tie: bool = False):
    return idefics3_config(tie)


def build(tmp_path, tie: bool = False):
    return build_idefics3(tmp_path / ("tied" if tie else "untied"), hf_config(tie))


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return build(tmp_path_factory.mktemp("idefics3"))


def image_run() -> list[int]:
    return [FAKE] + [IMAGE] * PER_IMAGE + [FAKE]


def batch(seed: int = 0):
    """input_ids [3, T], attention_mask, pixel_values [3, 2, 3, 32, 32], pixel_attention_mask
    [3, 2, 32, 32]: row 0 has two images (the second real on its top-left 24 x 16 pixels only),
    row 1 one image and left padding, row 2 no image and right padding."""
    rng = np.random.default_rng(seed)
    text = lambda n: list(rng.integers(0, FAKE, n))  # noqa: E731
    rows = [text(2) + image_run() + text(3) + image_run() + text(2),
            text(3) + image_run() + text(4),
            text(9)]
    t = max(map(len, rows))
    ids = np.zeros((3, t), np.int32)
    mask = np.zeros((3, t), np.int32)
    ids[0], mask[0] = rows[0], 1
    ids[1, t - len(rows[1]):], mask[1, t - len(rows[1]):] = rows[1], 1  # left padded
    ids[2, :len(rows[2])], mask[2, :len(rows[2])] = rows[2], 1  # right padded
    pixels = np.zeros((3, 2, 3, 32, 32), np.float32)
    pmask = np.zeros((3, 2, 32, 32), np.int64)
    for (b, i), (y, x) in {(0, 0): (32, 32), (0, 1): (24, 16), (1, 0): (32, 32)}.items():
        pixels[b, i, :, :y, :x] = rng.normal(size=(3, y, x))
        pmask[b, i, :y, :x] = 1
    return ids, mask, pixels, pmask


def positions_of(mask):
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0)


def hf_logits(ref, ids, mask, pixels=None, pmask=None):
    kw = {}
    if pixels is not None:
        kw = dict(pixel_values=torch.tensor(pixels), pixel_attention_mask=torch.tensor(pmask))
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(ids, dtype=torch.long),
                  attention_mask=torch.tensor(mask),
                  position_ids=torch.tensor(positions_of(mask), dtype=torch.long), **kw)
    return out.logits.float().numpy()


def test_loads_as_idefics3(models):
    _, model = models
    assert isinstance(model, Idefics3)
    assert model.config.image_token_id == IMAGE and model.config.scale_factor == 2
    assert model.config.vision.patches_per_side == 4 and model.config.text.family == "llama"


def test_logits_match_transformers(models):
    ref, model = models
    ids, mask, pixels, pmask = batch()
    theirs = hf_logits(ref, ids, mask, pixels, pmask)
    assert max_diff_on_real_tokens(forward(model, ids, mask, pixels, pmask), theirs,
                                   mask) <= TOL
    # What the comparison would miss otherwise: the images change the logits, and so does the
    # padded image's pixel mask (its padding patches hidden as keys, its positions stretched).
    assert max_diff_on_real_tokens(hf_logits(ref, ids, mask), theirs, mask) > 1e3 * TOL
    unmasked = forward(model, ids, mask, pixels, np.ones_like(pmask))
    assert max_diff_on_real_tokens(unmasked, theirs, mask) > 1e3 * TOL


def test_without_images_is_the_text_model(models):
    ref, model = models
    ids, mask, _, _ = batch(seed=2)
    ours = forward(model, ids, mask)
    text = nnx.jit(lambda m, ids, mask: m(ids, attention_mask=mask))(model.text, ids, mask)
    assert np.array_equal(ours, np.asarray(text))
    assert max_diff_on_real_tokens(ours, hf_logits(ref, ids, mask), mask) <= TOL


def test_image_tokens_that_do_not_match_the_images_are_refused(models):
    _, model = models
    ids, mask, pixels, pmask = batch()
    cut = ids.copy()
    cut[0, np.nonzero(ids[0] == IMAGE)[0][-1]] = 5  # one placeholder of row 0 lost
    with pytest.raises(InputError, match="Image features and image tokens do not match: row 0 "
                                         "has 7 image tokens"):
        model(cut, attention_mask=mask, pixel_values=pixels, pixel_attention_mask=pmask)
    moved = pixels.copy()
    moved[2, 0], moved[1, 0] = pixels[1, 0], 0  # row 1's image given to the text-only row
    with pytest.raises(InputError, match="row 1 has 4 image tokens .* but 0 images"):
        model(ids, attention_mask=mask, pixel_values=moved, pixel_attention_mask=pmask)


def test_tied_embeddings_follow_the_top_level_flag(tmp_path):
    ref, model = build(tmp_path, tie=True)
    assert model.config.text.tie_embeddings and model.text.lm_head is None
    ids, mask, pixels, pmask = batch(seed=3)
    ours = forward(model, ids, mask, pixels, pmask)
    assert max_diff_on_real_tokens(ours, hf_logits(ref, ids, mask, pixels, pmask), mask) <= TOL


def test_bucket_boundaries_are_torch_arange():
    for n in range(1, 300):
        assert np.array_equal(bucket_boundaries(n),
                              torch.arange(1 / n, 1.0, 1 / n).numpy()), n


@pytest.mark.parametrize("side", [4, 7, 19, 27])
def test_fractional_positions_match_transformers(side):
    """Every real area (rows x cols patches) of a side x side grid: transformers' position ids,
    read off its embeddings with a zero patch convolution and a position table whose first
    column is the row index."""
    config = transformers.Idefics3VisionConfig(hidden_size=4, image_size=side, patch_size=1,
                                               num_attention_heads=1)
    emb = transformers.models.idefics3.modeling_idefics3.Idefics3VisionEmbeddings(config)
    with torch.no_grad():
        emb.patch_embedding.weight.zero_()
        emb.patch_embedding.bias.zero_()
        emb.position_embedding.weight.zero_()
        emb.position_embedding.weight[:, 0] = torch.arange(side * side, dtype=torch.float32)
    areas = [(r, c) for r in range(1, side + 1) for c in range(1, side + 1)]
    valid = np.zeros((len(areas), side, side), bool)
    for k, (r, c) in enumerate(areas):
        valid[k, :r, :c] = True
    with torch.no_grad():
        theirs = emb(torch.zeros(len(areas), 3, side, side), torch.tensor(valid))[..., 0]
    ours = np.asarray(jax.jit(fractional_position_ids, static_argnums=1)(valid, side))
    assert np.array_equal(ours, theirs.numpy().astype(np.int32))
