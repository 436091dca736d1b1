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
from hone.weights.hf import load_hf


@pytest.mark.parametrize("name", list(CASES))
def test_logits_match_transformers(name, tmp_path):
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch()
    model = hone.load_model(folder, dtype="float32")
    ours = np.asarray(model(tokens, attention_mask=mask))  # default positions = cumsum - 1
    theirs = hf_logits(ref, tokens, mask, positions)
    assert max_diff_on_real_tokens(ours, theirs, mask) <= TOL


@pytest.mark.parametrize("name", ["llama", "qwen3", "gemma2", "gemma3_text"])
def test_blockwise_attention_logits_match_transformers(name, tmp_path):
    """The same comparison with blockwise attention (the path of rows longer than one block)
    over blocks of 4 positions: several blocks, skipped ones, and a sliding window shorter than
    the row where the family has one."""
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch()
    model = hone.load_model(folder, dtype="float32")
    model.attention, model.attention_block = "blockwise", 4
    ours = np.asarray(model(tokens, attention_mask=mask))
    assert max_diff_on_real_tokens(ours, hf_logits(ref, tokens, mask, positions), mask) <= TOL


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


@pytest.mark.parametrize("name", ["llama", "gemma2"])
def test_features_match_transformers_hidden_states_and_attentions(name, tmp_path):
    """One forward pass gives the intermediate activations distillation matches: the residual
    stream after each block and each block's attention probabilities, as transformers reports
    them with output_hidden_states / output_attentions."""
    ref, folder = hf_model(name, tmp_path)
    tokens, mask, positions = batch(seed=2)
    model = hone.load_model(folder, dtype="float32")
    n = len(model.layers)
    final, got = model.features(tokens, attention_mask=mask, hidden_layers=tuple(range(n + 1)),
                                attention_layers=tuple(range(n)))
    with torch.no_grad():
        out = ref(input_ids=torch.tensor(tokens, dtype=torch.long),
                  attention_mask=torch.tensor(mask),
                  position_ids=torch.tensor(positions, dtype=torch.long),
                  output_hidden_states=True, output_attentions=True)
    hidden = [h.float().numpy() for h in out.hidden_states]
    # transformers' last entry is final-normed; hone's features() returns that one separately.
    for layer in range(n):
        assert max_diff_on_real_tokens(np.asarray(got["hidden"][layer]), hidden[layer],
                                       mask) <= TOL
    assert max_diff_on_real_tokens(np.asarray(final), hidden[n], mask) <= TOL
    real = mask.astype(bool)
    for layer in range(n):
        ours = np.asarray(got["attention"][layer]).transpose(0, 2, 1, 3)  # [B, T, N, S]
        theirs = out.attentions[layer].float().numpy().transpose(0, 2, 1, 3)
        assert ours.shape == theirs.shape
        assert np.abs(ours[real] - theirs[real]).max() <= TOL  # real queries
    # The logits of features' final hidden state are the plain forward's.
    assert np.array_equal(np.asarray(model.logits_from_hidden(final)),
                          np.asarray(model(tokens, attention_mask=mask)))
    with pytest.raises(ValueError, match="hidden_layers must lie in"):
        model.features(tokens, hidden_layers=(n + 1,))
