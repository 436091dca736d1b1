"""hone's Idefics3 image preprocessing and prompt expansion against transformers'
Idefics3ImageProcessorPil and Idefics3Processor, on random PIL images of several sizes and modes
(RGB, RGBA with transparency, greyscale), with and without splitting into tiles."""

import numpy as np
import pytest
import transformers
from PIL import Image
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers.models.idefics3.image_processing_pil_idefics3 import Idefics3ImageProcessorPil

from hone.models.vision.idefics3_processor import Idefics3ImageSettings, expand_prompt, preprocess

SEQ = 4  # <image> tokens per frame (the model's Q)


def reference(longest: int, tile: int, split: bool):
    """transformers' processor over a tokenizer that only needs to know the special tokens."""
    vocab = {"[UNK]": 0, "<fake_token_around_image>": 1, "<image>": 2, "<global-img>": 3,
             "<end_of_utterance>": 4}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    images = Idefics3ImageProcessorPil(size={"longest_edge": longest},
                                       max_image_size={"longest_edge": tile},
                                       do_image_splitting=split)
    return transformers.Idefics3Processor(
        image_processor=images, image_seq_len=SEQ,
        tokenizer=transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer,
                                                       unk_token="[UNK]"))


def images(seed: int = 0):
    rng = np.random.default_rng(seed)
    noise = lambda *shape: rng.integers(0, 256, shape, dtype=np.uint8)  # noqa: E731
    rgba = noise(21, 15, 4)
    rgba[:5, :, 3] = 0  # fully transparent rows: composited onto white
    return [[Image.fromarray(noise(50, 71, 3)), Image.fromarray(rgba, "RGBA")],
            [Image.fromarray(noise(203, 90), "L")],
            [Image.fromarray(noise(33, 33, 3)), Image.fromarray(noise(17, 64, 3)),
             Image.fromarray(noise(64, 9, 3))]]


@pytest.mark.parametrize("longest, tile, split", [(96, 32, True), (32, 32, True),
                                                  (96, 32, False)])
def test_pixels_and_prompts_match_transformers(longest, tile, split):
    batch = images()
    ref = reference(longest, tile, split)
    theirs, replacements = ref._process_images(batch, return_row_col_info=True)
    settings = Idefics3ImageSettings(longest_edge=longest, tile=tile, split=split,
                                     image_seq_len=SEQ)
    ours = preprocess(batch, settings)
    assert ours["pixel_values"].shape == theirs["pixel_values"].shape
    assert ours["pixel_values"].dtype == theirs["pixel_values"].dtype == np.float32
    # Bit for bit (the goal is 1e-6): the same PIL resizes and the same float steps.
    assert np.array_equal(ours["pixel_values"], theirs["pixel_values"])
    assert np.array_equal(ours["pixel_attention_mask"], theirs["pixel_attention_mask"])
    assert [[r for r, _ in g] for g in ours["grids"]] == theirs["rows"]
    assert [[c for _, c in g] for g in ours["grids"]] == theirs["cols"]
    prompts = ["a <image> b <image>", "<image>\nwhat is it?", "<image><image> c <image>"]
    expanded, _ = ref.get_text_with_replacements(list(prompts), images_replacements=replacements)
    assert [expand_prompt(p, g, SEQ) for p, g in zip(prompts, ours["grids"])] == expanded


def test_a_prompt_whose_images_do_not_match_is_refused():
    with pytest.raises(ValueError, match="2 <image> but 1 images"):
        expand_prompt("<image><image>", [(0, 0)], SEQ)
