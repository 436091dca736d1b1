"""The GGUF export of the shipped SmolLM2-135M-Instruct after the demo's LoRA fine-tuning (the
demo's own settings, one step: the test is about the file, and any trained adapters merged into
it show whether it holds them): the f32 file, read back by hone, answers with the run's greedy
text and keeps the shipped tokenizer keys. transformers reads the exported files of the
families it can in test_gguf_export.py (a 540 MB load here would add 15 s and no new check).
q4_k_m is refused: SmolLM2's width 576 is not a multiple of the 256-value K block. The other
types' rounding is bounded on tiny models of every family in test_gguf_export.py; on this model
see docs/guides/export.md.
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
    run = tmp_path / "run"
    overrides = [o for o in DEMO_OVERRIDES if not o.startswith("run_dir=")]
    assert main(["sft", *overrides, f"run_dir={run}", "train.max_steps=1",
                 "train.warmup_steps=0"]) == 0
    trained, tok, _ = load_run_model(run)
    prompt = tok.apply_chat_template(PROMPT)
    want = generate(trained, tok, [prompt], max_new_tokens=24)[0].tokens

    path = export_run(run, tmp_path / "smol-f32.gguf", "gguf", "f32")
    got = generate(load_model(path), tok, [prompt], max_new_tokens=24)[0].tokens
    assert got == want
    keys = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges")
    ours = read_metadata(path, arrays=keys)
    shipped = read_metadata(shipped_gguf_path("smollm2-135m-instruct"), arrays=keys)
    for key in (*keys, "tokenizer.ggml.pre", "tokenizer.chat_template",
                "tokenizer.ggml.eos_token_id"):
        assert ours[key] == shipped[key], key
    np.testing.assert_array_equal(ours["tokenizer.ggml.token_type"],
                                  shipped["tokenizer.ggml.token_type"])
    with pytest.raises(InputError, match="not a multiple of the Q6_K block of 256"):
        export_run(run, tmp_path / "smol-q4.gguf", "gguf", "q4_k_m")
