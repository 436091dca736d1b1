"""The GGUF export of the shipped SmolLM2-135M-Instruct: the f32 and q8_0 files, read back by
hone, and the f32 file read by transformers, answer with the model's own greedy text; the file
keeps the shipped tokenizer keys. (q4_k_m is refused: SmolLM2's width 576 is not a multiple of
the 256-value K block.) Runs with adapters export through the same writer after merging, tested
on tiny models in test_gguf_export.py; this test is about the real model's size, weights and
tokenizer, so it exports the shipped model itself (a training run here cost two minutes).
"""

from __future__ import annotations

import numpy as np
import pytest

from hone.errors import InputError
from hone.export import export_gguf
from hone.sampling.generate import generate
from hone.tokenizer import load_tokenizer
from hone.weights.gguf_format import read_metadata
from hone.weights.loading import load_model
from hone.weights.shipped import shipped_gguf_path

SOURCE = "smollm2-135m-instruct"
PROMPT = [{"role": "user", "content": "Tom has 12 apples and buys 7 more. How many apples?"}]


@pytest.mark.real_model
def test_the_shipped_model_exports_to_gguf_with_the_same_greedy_text(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model, tok = load_model(SOURCE), load_tokenizer(SOURCE)
    prompt = tok.apply_chat_template(PROMPT)
    want = generate(model, tok, [prompt], max_new_tokens=24)[0].tokens

    for quant in ("f32", "q8_0"):
        path = export_gguf(model, tok, tmp_path / f"smol-{quant}.gguf", quant, SOURCE)
        got = generate(load_model(path), tok, [prompt], max_new_tokens=24)[0].tokens
        assert got == want, quant
    ids = tok.encode(prompt, add_special_tokens=False)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="smol-f32.gguf", dtype=torch.float32).eval()
    with torch.no_grad():
        out = theirs.generate(torch.tensor([ids]), max_new_tokens=24, do_sample=False,
                              eos_token_id=None, pad_token_id=tok.pad_id)
    n = len(want) - (want[-1] in tok.eos_ids)  # hone stops at EOS, transformers here does not
    assert out[0, len(ids):len(ids) + n].tolist() == want[:n]

    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
    ours = read_metadata(tmp_path / "smol-q8_0.gguf", arrays=keys)
    shipped = read_metadata(shipped_gguf_path(SOURCE), arrays=keys)
    for key in (*keys, "tokenizer.ggml.pre", "tokenizer.chat_template", "tokenizer.ggml.eos_token_id"):
        assert ours[key] == shipped[key], key
    np.testing.assert_array_equal(ours["tokenizer.ggml.token_type"],
                                  shipped["tokenizer.ggml.token_type"])
    with pytest.raises(InputError, match="not a multiple of the Q6_K block of 256"):
        export_gguf(model, tok, tmp_path / "smol-q4.gguf", "q4_k_m", SOURCE)
    assert not (tmp_path / "smol-q4.gguf").exists()
