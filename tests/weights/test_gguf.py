"""Tests for hone/weights/gguf.py: GGUF -> HF config + tensors.

- Synthetic files written with `gguf.GGUFWriter` from known HF tensors (with llama.cpp's Q/K row
  permutation and Gemma's +1 norm offset applied here, independently of the reader) must read
  back as those tensors.
- Broken files (random bytes, truncated, unsupported architecture, wrong tensor shape) must raise
  InputError naming the file, and the tensor where there is one.

The container parser on its own is tested in test_gguf_format.py, the shipped models in
test_shipped.py.
"""

from __future__ import annotations

import functools

import gguf
import ml_dtypes
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hone.weights.gguf as hg
from hone.errors import InputError
from hone.weights.gguf import read_gguf

# Tiny llama: D=64 so rows split into Q8_0 blocks of 32; F=96 (3 blocks) for down_proj rows.
V, D, F, N, K, H, L = 100, 64, 96, 4, 2, 16, 2


def _llama_cpp_permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """What llama.cpp's converter does to HF Q/K rows: per head, (half, i) -> (i, half)."""
    rows = w.shape[0]
    return w.reshape(n_heads, 2, rows // n_heads // 2, -1).swapaxes(1, 2).reshape(w.shape)


def _hf_llama_tensors(seed: int = 0, tied: bool = True) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)

    def w(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    t = {"model.embed_tokens.weight": w(V, D), "model.norm.weight": w(D)}
    if not tied:
        t["lm_head.weight"] = w(V, D)
    for i in range(L):
        p = f"model.layers.{i}."
        t.update({p + "input_layernorm.weight": w(D), p + "post_attention_layernorm.weight": w(D),
                  p + "self_attn.q_proj.weight": w(N * H, D),
                  p + "self_attn.k_proj.weight": w(K * H, D),
                  p + "self_attn.v_proj.weight": w(K * H, D),
                  p + "self_attn.o_proj.weight": w(D, N * H),
                  p + "mlp.gate_proj.weight": w(F, D), p + "mlp.up_proj.weight": w(F, D),
                  p + "mlp.down_proj.weight": w(D, F)})
    return t


_LLAMA_NAMES = {  # HF suffix -> GGUF name, written out here rather than taken from the reader
    "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GEMMA_NAMES = {
    "input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm",
    **{k: v for k, v in _LLAMA_NAMES.items() if "proj" in k},
}


def _gguf_name(hf_name: str, table: dict[str, str]) -> str:
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    if hf_name == "lm_head.weight":
        return "output.weight"
    _, _, i, rest = hf_name.split(".", 3)
    return f"blk.{i}.{table[rest.removesuffix('.weight')]}.weight"


# Which storage type each synthetic tensor gets: a mix so every path (F32 view, F16 cast, Q8_0
# dequantization) goes through the permutation and the renaming.
_QTYPES = {"self_attn.q_proj": [QT.F32, QT.Q8_0], "self_attn.k_proj": [QT.F16, QT.F32],
           "mlp.down_proj": [QT.Q8_0, QT.F16], "mlp.gate_proj": [QT.F16, QT.Q8_0],
           "model.embed_tokens.weight": [QT.Q8_0]}


def _qtype(hf_name: str) -> QT:
    for key, types in _QTYPES.items():
        if key in hf_name:
            layer = int(hf_name.split(".")[2]) if hf_name.startswith("model.layers.") else 0
            return types[layer % len(types)]
    return QT.F32


def _stored(x: np.ndarray, qtype: QT) -> np.ndarray:
    """The array as GGUF holds it: float32, float16, or quantized bytes."""
    if qtype == QT.F32:
        return x
    if qtype == QT.F16:
        return x.astype(np.float16)
    return gguf.quants.quantize(x, qtype)


def _roundtrip(x: np.ndarray, qtype: QT) -> np.ndarray:
    """What a perfect reader returns for `x` stored as `qtype` (quantization loses precision)."""
    if qtype == QT.F32:
        return x
    if qtype == QT.F16:
        return x.astype(np.float16).astype(np.float32)
    # Q8_0 blocks run along rows, so the row permutation commutes with quantization.
    return gguf.quants.dequantize(gguf.quants.quantize(x, qtype), qtype)


def _write(path, arch: str, hf: dict[str, np.ndarray], *, n_layers=L, heads=N, kv_heads=K,
           meta=None, override=None) -> None:
    """A GGUF file like llama.cpp's converter would write for these HF tensors."""
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(n_layers)
    writer.add_context_length(256)
    writer.add_embedding_length(D)
    writer.add_feed_forward_length(F)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_token_list([f"t{i}" for i in range(V)])  # a string array the parser must skip
    for key, value in (meta or {}).items():
        getattr(writer, f"add_{key}")(value)
    table = _GEMMA_NAMES if arch == "gemma3" else _LLAMA_NAMES
    for name, x in hf.items():
        if arch == "llama" and "q_proj" in name:
            x = _llama_cpp_permute(x, heads)
        elif arch == "llama" and "k_proj" in name:
            x = _llama_cpp_permute(x, kv_heads)
        elif arch == "gemma3" and name.endswith("norm.weight"):
            x = x + np.float32(1.0)
        gname = _gguf_name(name, table)
        if override and gname in override:
            x = override[gname]
        qtype = _qtype(name)
        writer.add_tensor(gname, _stored(x, qtype), raw_dtype=qtype if qtype == QT.Q8_0 else None)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


# ----------------------------------------------------------------------------------------------
# Synthetic round trips


def test_unpermute_matches_hand_layout():
    # One head, head_dim 4: HF rows (re0, re1, im0, im1) are stored as (re0, im0, re1, im1).
    stored = np.array([[0.0], [2.0], [1.0], [3.0]], dtype=np.float32)
    np.testing.assert_array_equal(hg._unpermute_rotary(stored, 1)[:, 0], [0.0, 1.0, 2.0, 3.0])


@pytest.mark.parametrize("tied", [True, False])
def test_llama_roundtrip_recovers_hf_tensors(tmp_path, tied):
    hf = _hf_llama_tensors(tied=tied)
    path = tmp_path / "tiny-llama.gguf"
    _write(path, "llama", hf)
    config, tensors = read_gguf(path)

    assert set(tensors) == set(hf)
    for name, x in hf.items():
        got = tensors[name]
        assert got.dtype == np.float32 and got.shape == x.shape, name
        np.testing.assert_array_equal(got, _roundtrip(x, _qtype(name)), err_msg=name)
        np.testing.assert_allclose(got, x, atol=0.05, err_msg=name)  # and close to the original
    assert config == {
        "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": V,
        "hidden_size": D, "intermediate_size": F, "num_hidden_layers": L,
        "num_attention_heads": N, "num_key_value_heads": K, "head_dim": H, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 256, "tie_word_embeddings": tied,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": None, "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "rope_scaling": None}


def test_dtype_and_independence_from_file(tmp_path):
    hf = _hf_llama_tensors()
    path = tmp_path / "tiny-llama.gguf"
    _write(path, "llama", hf)
    _, t32 = read_gguf(path)
    _, t16 = read_gguf(path, dtype=np.float16)
    _, tbf = read_gguf(path, dtype=ml_dtypes.bfloat16)
    path.write_bytes(b"\0" * path.stat().st_size)  # arrays must be copies, not views of the file
    for name, x in t32.items():
        assert t16[name].dtype == np.float16 and tbf[name].dtype == ml_dtypes.bfloat16
        np.testing.assert_array_equal(t16[name], x.astype(np.float16), err_msg=name)
        np.testing.assert_array_equal(tbf[name], x.astype(ml_dtypes.bfloat16), err_msg=name)
    np.testing.assert_array_equal(t32["model.norm.weight"], hf["model.norm.weight"])


def _hf_gemma_tensors(n_layers: int) -> dict[str, np.ndarray]:
    """Llama's tensors plus Gemma 3's extra norms, for `n_layers` layers."""
    rng = np.random.default_rng(1)
    t = {}
    for name, x in _hf_llama_tensors(seed=1).items():
        if name.startswith("model.layers.0."):
            for i in range(n_layers):  # same values in every layer: only the names matter here
                t[name.replace(".0.", f".{i}.", 1)] = x
        elif not name.startswith("model.layers."):
            t[name] = x
    for i in range(n_layers):
        for extra, size in [("pre_feedforward_layernorm", D), ("post_feedforward_layernorm", D),
                            ("self_attn.q_norm", H), ("self_attn.k_norm", H)]:
            t[f"model.layers.{i}.{extra}.weight"] = rng.standard_normal(size).astype(np.float32)
    return t


def test_gemma3_roundtrip_removes_norm_offset(tmp_path):
    n_layers = 7
    hf = _hf_gemma_tensors(n_layers)
    path = tmp_path / "tiny-gemma3.gguf"
    _write(path, "gemma3", hf, n_layers=n_layers,
           meta={"key_length": H, "value_length": H, "sliding_window": 8})
    config, tensors = read_gguf(path)

    assert set(tensors) == set(hf)
    for name, x in hf.items():
        # Gemma Q/K rows are not permuted (its rotary matches HF's); norms lose the stored +1.
        np.testing.assert_allclose(tensors[name], _roundtrip(x, _qtype(name)), rtol=0,
                                   atol=1e-6, err_msg=name)
    assert config["model_type"] == "gemma3_text"
    assert config["hidden_activation"] == "gelu_pytorch_tanh"
    assert config["sliding_window"] == 8 and config["query_pre_attn_scalar"] == H
    assert config["rope_local_base_freq"] == 10000.0
    assert config["layer_types"] == ["sliding_attention"] * 5 + ["full_attention",
                                                                 "sliding_attention"]


# ----------------------------------------------------------------------------------------------
# Broken files


def _valid_file(tmp_path, name="model.gguf"):
    path = tmp_path / name
    _write(path, "llama", _hf_llama_tensors())
    return path


def _gguf_prefix(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + (3).to_bytes(4, "little") + n_tensors.to_bytes(8, "little") + n_kv.to_bytes(
        8, "little")


@pytest.mark.parametrize("content", [
    b"", b"GG", np.random.default_rng(0).bytes(5000),  # not GGUF at all
    b"GGUF" + np.random.default_rng(1).bytes(5000),  # magic, then a nonsense version
    _gguf_prefix(2**40, 2**40) + np.random.default_rng(2).bytes(5000),  # absurd counts
    _gguf_prefix(1, 3) + np.random.default_rng(3).bytes(5000),  # plausible counts, garbage after
])
def test_not_gguf(tmp_path, content):
    path = tmp_path / "noise.gguf"
    path.write_bytes(content)
    with pytest.raises(InputError, match="noise.gguf"):
        read_gguf(path)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="absent.gguf"):
        read_gguf(tmp_path / "absent.gguf")


def test_truncated_in_tensor_data(tmp_path):
    data = _valid_file(tmp_path).read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:-1000])
    # The last tensor written is the last one in the data section.
    last = _gguf_name(list(_hf_llama_tensors())[-1], _LLAMA_NAMES)
    with pytest.raises(InputError, match=r"cut\.gguf.*truncated") as err:
        read_gguf(cut)
    assert last in str(err.value)


@pytest.mark.parametrize("keep", [10, 30, 200, 2000])
def test_truncated_in_header(tmp_path, keep):
    data = _valid_file(tmp_path).read_bytes()
    cut = tmp_path / "head.gguf"
    cut.write_bytes(data[:keep])
    with pytest.raises(InputError, match=r"head\.gguf"):
        read_gguf(cut)


@functools.cache
def _valid_bytes() -> tuple[bytes, int]:
    """A small valid file and where its tensor data starts (by gguf's own reader)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as folder:
        path = _valid_file(Path(folder))
        return path.read_bytes(), gguf.GGUFReader(path).data_offset


@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cut=st.integers(0, 10**9), flips=st.lists(
    st.tuples(st.integers(0, 10**9), st.integers(0, 255)), min_size=1, max_size=4))
def test_damaged_files_raise_input_error_or_read(tmp_path, cut, flips):
    """Property: any truncation raises InputError; corrupted header bytes either still read
    or raise InputError, never another exception (and never hang on a huge count)."""
    data, header_size = _valid_bytes()
    path = tmp_path / "damaged.gguf"
    path.write_bytes(data[:cut % len(data)])
    with pytest.raises(InputError, match="damaged.gguf"):
        read_gguf(path)
    damaged = bytearray(data)
    for pos, value in flips:
        damaged[pos % header_size] = value
    path.write_bytes(bytes(damaged))
    try:
        read_gguf(path)
    except InputError as e:
        assert "damaged.gguf" in str(e)


def test_corrupt_counts(tmp_path):
    data = bytearray(_valid_bytes()[0])
    data[16:24] = (2**62).to_bytes(8, "little")  # metadata count
    bad = tmp_path / "counts.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(InputError, match=r"counts\.gguf.*corrupt"):
        read_gguf(bad)


def test_unsupported_architecture(tmp_path):
    path = tmp_path / "snake.gguf"
    writer = gguf.GGUFWriter(str(path), "mamba")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((V, D), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InputError, match=r"snake\.gguf.*'mamba'"):
        read_gguf(path)


def test_wrong_tensor_shape(tmp_path):
    path = tmp_path / "shape.gguf"
    # K projection with as many rows as Q: its element count does not fit K*H x D.
    wrong = np.zeros((N * H, D), np.float32)
    _write(path, "llama", _hf_llama_tensors(), override={"blk.1.attn_k.weight": wrong})
    with pytest.raises(InputError, match=r"shape\.gguf.*blk\.1\.attn_k\.weight"):
        read_gguf(path)


def test_unknown_tensor(tmp_path):
    # A Q bias (Qwen2-style) is not part of the llama layout: refuse rather than drop it.
    path = tmp_path / "extra.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in [("block_count", L), ("context_length", 256), ("embedding_length", D),
                       ("feed_forward_length", F), ("head_count", N), ("head_count_kv", K),
                       ("layer_norm_rms_eps", 1e-5)]:
        getattr(writer, f"add_{key}")(value)
    for name, x in _hf_llama_tensors().items():
        writer.add_tensor(_gguf_name(name, _LLAMA_NAMES), x)
    writer.add_tensor("blk.0.attn_q.bias", np.zeros(N * H, np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(InputError, match=r"extra\.gguf.*blk\.0\.attn_q\.bias"):
        read_gguf(path)
