"""The GGUF export of the shipped SmolLM2-135M-Instruct after the demo's LoRA fine-tuning (the
demo's own settings, fewer steps): the f32 and q8_0 files, read back by hone and by
transformers, answer with the run's greedy text; the file keeps the shipped tokenizer keys.
(q4_k_m is refused: SmolLM2's width 576 is not a multiple of the 256-value K block.)
"""

from __future__ import annotations

import numpy as np
import pytest

from hone.cli import main
from hone.errors import InputError
from hone.export import export_run, load_run_model
from hone.recipes.demo import DEMO_OVERRIDES
from hone.sampling.generate import generate
from hone.weights.gguf_format import read_metadata
from hone.weights.loading import load_model
from hone.weights.shipped import shipped_gguf_path

PROMPT = [{"role": "user", "content": "Tom has 12 apples and buys 7 more. How many apples?"}]


@pytest.mark.real_model
def test_demo_run_exports_to_gguf_with_the_same_greedy_text(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    run = tmp_path / "run"
    overrides = [o for o in DEMO_OVERRIDES if not o.startswith("run_dir=")]
    assert main(["sft", *overrides, f"run_dir={run}", "train.max_steps=4"]) == 0
    trained, tok, _ = load_run_model(run)
    prompt = tok.apply_chat_template(PROMPT)
    want = generate(trained, tok, [prompt], max_new_tokens=24)[0].tokens

    for quant in ("f32", "q8_0"):
        path = export_run(run, tmp_path / f"smol-{quant}.gguf", "gguf", quant)
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
    shipped = read_metadata(shipped_gguf_path("smollm2-135m-instruct"), arrays=keys)
    for key in (*keys, "tokenizer.ggml.pre", "tokenizer.chat_template", "tokenizer.ggml.eos_token_id"):
        assert ours[key] == shipped[key], key
    np.testing.assert_array_equal(ours["tokenizer.ggml.token_type"],
                                  shipped["tokenizer.ggml.token_type"])
    with pytest.raises(InputError, match="not a multiple of the Q6_K block of 256"):
        export_run(run, tmp_path / "smol-q4.gguf", "gguf", "q4_k_m")
