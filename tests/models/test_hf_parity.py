"""hone's transformer against transformers' reference implementation, family by family.

Each case builds a small random model with transformers (GQA, odd head counts, a sequence longer
than the sliding window where there is one), saves it with save_pretrained, loads it with
hone.load_model and compares fp32 logits on a padded batch (left- and right-padded rows).
Every weight, norms and biases included, is randomised so no term can hide behind a zero.
"""

import numpy as np
import pytest
import torch
import transformers
from reference import CASES, TOL, batch, hf_logits, hf_model, max_diff_on_real_tokens

import hone
from hone.models.hf import load_hf


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(name, tmp_path):
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch()
    model = hone.load_model(folder, dtype="float32")
    ours = np.asarray(model(tokens, attention_mask=mask))  # default positions = cumsum - 1
    theirs = hf_logits(ref, tokens, mask, positions)
    assert max_diff_on_real_tokens(ours, theirs, mask) <= TOL


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma2", "gemma3_text"])
def test_save_hf_round_trip(name, tmp_path):
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch(seed=1)
    model = hone.load_model(folder)
    out = hone.save_hf(model, tmp_path / "export")
    reloaded_ref = transformers.AutoModelForCausalLM.from_pretrained(
        str(out), dtype=torch.float32, attn_implementation="eager").eval()
    ours = np.asarray(model(tokens, attention_mask=mask))
    assert max_diff_on_real_tokens(hf_logits(reloaded_ref, tokens, mask, positions), ours,
                                   mask) <= TOL
    again = load_hf(out)
    import jax
    from flax import nnx
    for a, b in zip(jax.tree.leaves(nnx.state(model)), jax.tree.leaves(nnx.state(again))):
        assert np.array_equal(np.asarray(a), np.asarray(b))
