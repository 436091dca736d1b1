"""`hone.generate` with images: an Idefics3 prompt's prefill runs the image-filled embeddings,
decoding the language model; greedy tokens equal transformers' generate, log-probabilities the
teacher-forced ones of the model's own forward pass with the images.

The tiny random Idefics3 of tests/models/test_idefics3.py (a 2-layer SigLIP-style tower over
4 x 4 patches of 8 pixels, 4 placeholders per image, a 2-layer Llama). One batch mixes a prompt
with two images (the second real on part of its pixels only), a prompt with one image and a
text-only prompt, left-padded to a common length as both samplers pad.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from vision_reference import FAKE, IMAGE, PER_IMAGE, build_idefics3, idefics3_config

from hone.errors import InputError
from hone.sampling.generate import generate

NEW = 8
TOL = 1e-4  # the sampler's fixed tolerance (tests/sampling/test_generate.py); never loosened


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """(transformers' Idefics3ForConditionalGeneration, hone's model of its saved folder)."""
    return build_idefics3(tmp_path_factory.mktemp("idefics3_generate"), idefics3_config())


def prompts_and_images(seed: int = 0):
    """Three prompts (token ids, placeholders expanded), pixel_values [3, 2, 3, 32, 32] and
    pixel_attention_mask [3, 2, 32, 32]: two images, one image, none."""
    rng = np.random.default_rng(seed)
    text = lambda n: rng.integers(1, FAKE, n).tolist()  # noqa: E731
    image = [FAKE] + [IMAGE] * PER_IMAGE + [FAKE]
    prompts = [text(2) + image + text(3) + image + text(1), text(3) + image + text(2), text(5)]
    pixels = np.zeros((3, 2, 3, 32, 32), np.float32)
    pmask = np.zeros((3, 2, 32, 32), np.int64)
    for (b, i), (y, x) in {(0, 0): (32, 32), (0, 1): (24, 16), (1, 0): (32, 32)}.items():
        pixels[b, i, :, :y, :x] = rng.normal(size=(3, y, x))
        pmask[b, i, :y, :x] = 1
    return prompts, pixels, pmask


def hf_greedy(ref, prompts, pixels, pmask) -> list[list[int]]:
    """transformers' greedy continuation of the left-padded prompts: exactly NEW ids each."""
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = ref.generate(input_ids=ids, attention_mask=mask,
                           pixel_values=torch.tensor(pixels),
                           pixel_attention_mask=torch.tensor(pmask), max_new_tokens=NEW,
                           min_new_tokens=NEW, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    return out[:, width:].tolist()


@nnx.jit
def _logits(model, ids, mask, generated, pixels, pmask):
    """The forward pass over prompts with their images and the generated tokens: a generated
    `<image>` id is an ordinary token's embedding, as both samplers decode it (only the
    prompt's placeholders take image features)."""
    prompt_ids = jnp.where(generated, 0, ids)
    embeds = jnp.where(generated[..., None], model.text.embedder.encode(ids),
                       model.embed(prompt_ids, pixels, pmask))
    return model.text.logits_from_hidden(model.text.hidden(ids, attention_mask=mask,
                                                           embeds=embeds))


def teacher_forced(model, prompts, completions, pixels, pmask) -> list[np.ndarray]:
    """log p of each completion token under the model's forward pass over prompt, images and
    completion (right-padded rows)."""
    seqs = [p + c for p, c in zip(prompts, completions)]
    width = max(map(len, seqs))
    ids, mask = np.zeros((len(seqs), width), np.int32), np.zeros((len(seqs), width), np.int32)
    generated = np.zeros((len(seqs), width), bool)
    for i, (p, s) in enumerate(zip(prompts, seqs)):
        ids[i, :len(s)], mask[i, :len(s)], generated[i, len(p):len(s)] = s, 1, True
    lp = np.asarray(jax.nn.log_softmax(
        _logits(model, ids, mask, generated, pixels, pmask), axis=-1))
    return [np.array([lp[i, len(p) - 1 + j, t] for j, t in enumerate(c)])
            for i, (p, c) in enumerate(zip(prompts, completions))]


def test_greedy_with_images_matches_transformers_generate(models):
    ref, model = models
    prompts, pixels, pmask = prompts_and_images()
    outs = generate(model, None, prompts, max_new_tokens=NEW, eos_ids=(),
                    pixel_values=pixels, pixel_attention_mask=pmask)
    tokens = [o.tokens for o in outs]
    assert tokens == hf_greedy(ref, prompts, pixels, pmask)
    for tf, o in zip(teacher_forced(model, prompts, tokens, pixels, pmask), outs):
        assert np.abs(tf - np.array(o.logprobs)).max() <= TOL
    # The images are used: without them the image prompts continue differently, and the
    # text-only prompt is the language model's own continuation either way.
    blind = generate(model, None, prompts, max_new_tokens=NEW, eos_ids=())
    assert blind[0].tokens != tokens[0] and blind[1].tokens != tokens[1]
    assert blind[2].tokens == tokens[2]


def test_n_samples_share_the_image_prefill(models):
    """n copies of each prompt go through one prefill with the images (rows repeated after):
    greedy, each copy is the prompt's one continuation."""
    _, model = models
    prompts, pixels, pmask = prompts_and_images()
    kw = dict(max_new_tokens=NEW, eos_ids=(), pixel_values=pixels, pixel_attention_mask=pmask)
    one = generate(model, None, prompts, **kw)  # the shapes of the test above: compiled already
    two = generate(model, None, prompts, n=2, **kw)
    assert [o.tokens for o in two] == [o.tokens for o in one for _ in range(2)]


def test_bad_image_inputs_are_refused_before_compiling(models):
    _, model = models
    prompts, pixels, pmask = prompts_and_images()
    with pytest.raises(InputError, match="paged engine does not take images"):
        generate(model, None, prompts, NEW, pixel_values=pixels, engine="paged")
    with pytest.raises(InputError, match="need a vision-language model"):
        generate(model.text, None, prompts, NEW, pixel_values=pixels)
    with pytest.raises(InputError, match=r"expected \[prompts=3"):
        generate(model, None, prompts, NEW, pixel_values=pixels[:2])
    with pytest.raises(InputError, match="pixel_values' without the channels"):
        generate(model, None, prompts, NEW, pixel_values=pixels,
                 pixel_attention_mask=pmask[:, :1])
    cut = [list(p) for p in prompts]
    del cut[0][len(cut[0]) - 1 - cut[0][::-1].index(IMAGE)]  # row 0 loses a placeholder
    with pytest.raises(InputError, match="Image features and image tokens do not match: row 0 "
                                         "has 7 image tokens"):
        generate(model, None, cut, NEW, pixel_values=pixels, pixel_attention_mask=pmask)
