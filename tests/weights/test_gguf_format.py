"""Tests for hone/weights/gguf_format.py: the GGUF container on its own.

- Metadata written by `gguf.GGUFWriter` (every value type, random values) reads back as written;
  string arrays are decoded exactly for the keys asked for, and walked over otherwise.
- The tensor directory (names, shapes, types, data offsets) agrees with `gguf.GGUFReader`.
- Big-endian files parse to the same metadata; the weight loader refuses them by name.
- Cut or corrupt headers raise InputError naming the file, never another exception.
"""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFEndian, GGUFValueType
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hone.errors import InputError
from hone.weights.gguf import read_gguf
from hone.weights.gguf_format import SkippedArray, open_gguf, read_metadata

T = GGUFValueType
TOKENS = ["<s>", "</s>", "hello", " wor", "ld", "▁é", "世界", ""]
MERGES = ["h e", "l l", "wor ld"]


def _write(path, endian=GGUFEndian.LITTLE, tensors=True, extra=None):
    writer = gguf.GGUFWriter(str(path), "llama", endianess=endian)
    writer.add_block_count(3)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_bool("tokenizer.ggml.add_bos_token", True)
    writer.add_token_list(TOKENS)
    writer.add_token_merges(MERGES)
    writer.add_token_scores([float(-i) for i in range(len(TOKENS))])
    writer.add_token_types([1] * len(TOKENS))
    writer.add_array("test.nested", [["a", "b"], ["c"]])
    for key, (value, vtype) in (extra or {}).items():
        writer.add_key_value(key, value, vtype)
    if tensors:
        writer.add_tensor("a.weight", np.arange(12, dtype=np.float32).reshape(3, 4))
        writer.add_tensor("b.weight", np.ones((2, 64), np.float16))
        writer.add_tensor("c.weight", gguf.quants.quantize(np.ones((2, 64), np.float32), QT.Q8_0),
                          raw_dtype=QT.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_string_arrays_decoded_only_when_asked(tmp_path):
    path = _write(tmp_path / "m.gguf")
    skipped = read_metadata(path)
    assert skipped["tokenizer.ggml.tokens"] == SkippedArray(len(TOKENS))
    assert skipped["tokenizer.ggml.merges"] == SkippedArray(len(MERGES))
    assert skipped["test.nested"] == SkippedArray(2)

    meta = read_metadata(path, arrays={"tokenizer.ggml.tokens", "tokenizer.ggml.merges",
                                       "test.nested"})
    assert meta["tokenizer.ggml.tokens"] == TOKENS
    assert meta["tokenizer.ggml.merges"] == MERGES
    assert meta["test.nested"] == [["a", "b"], ["c"]]
    # Everything else is the same whichever arrays are decoded.
    for key in ("general.architecture", "llama.block_count", "tokenizer.ggml.add_bos_token"):
        assert meta[key] == skipped[key]
    assert meta["general.architecture"] == "llama" and meta["llama.block_count"] == 3
    assert meta["tokenizer.ggml.add_bos_token"] is True
    # float32 scalars come back as the decimal the converter wrote, not its float64 widening.
    assert meta["llama.attention.layer_norm_rms_epsilon"] == 1e-6
    scores = meta["tokenizer.ggml.scores"]
    assert scores.dtype == np.float32 and scores.tolist() == [float(-i) for i in range(8)]
    assert meta["tokenizer.ggml.token_type"].tolist() == [1] * len(TOKENS)


def test_tensor_directory_matches_gguf_reader(tmp_path):
    path = _write(tmp_path / "t.gguf")
    reader = gguf.GGUFReader(path)
    with open_gguf(path) as f:
        assert f.byte_order == "<"
        assert list(f.tensors) == [t.name for t in reader.tensors]
        for ref in reader.tensors:
            info = f.tensors[ref.name]
            assert info.qtype == ref.tensor_type
            assert info.dims == tuple(int(d) for d in ref.shape)
            assert info.start == ref.data_offset  # absolute in GGUFReader too
            assert info.nbytes == ref.n_bytes
            np.testing.assert_array_equal(f.tensor_bytes(info), ref.data.view(np.uint8).ravel())
        assert f.tensors["a.weight"].shape == (3, 4)  # numpy order, the reverse of ggml's dims


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).map(lambda k: "x." + k),
    st.one_of(
        st.tuples(st.integers(0, 2**32 - 1), st.just(T.UINT32)),
        st.tuples(st.integers(-2**63, 2**63 - 1), st.just(T.INT64)),
        st.tuples(st.floats(width=32, allow_nan=False), st.just(T.FLOAT32)),
        st.tuples(st.floats(allow_nan=False), st.just(T.FLOAT64)),
        st.tuples(st.booleans(), st.just(T.BOOL)),
        st.tuples(st.text(st.characters(codec="utf-8"), max_size=20), st.just(T.STRING))),
    max_size=6), big=st.booleans())
def test_metadata_round_trip(tmp_path, values, big):
    """Property: any scalar metadata, in either byte order, reads back as written."""
    path = _write(tmp_path / "p.gguf", GGUFEndian.BIG if big else GGUFEndian.LITTLE,
                  tensors=False, extra=values)
    meta = read_metadata(path, arrays=["tokenizer.ggml.tokens"])
    assert meta["tokenizer.ggml.tokens"] == TOKENS
    for key, (value, vtype) in values.items():
        if vtype == T.FLOAT32:
            assert np.float32(meta[key]) == np.float32(value), key
        else:
            assert meta[key] == value and type(meta[key]) is type(value), key


def test_big_endian_metadata_reads_but_weights_are_refused(tmp_path):
    little = _write(tmp_path / "little.gguf")
    big = _write(tmp_path / "big.gguf", GGUFEndian.BIG)
    keys = ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"]
    want, got = read_metadata(little, arrays=keys), read_metadata(big, arrays=keys)
    assert set(got) == set(want)
    for key, value in want.items():
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(got[key], value, err_msg=key)
        else:
            assert got[key] == value, key
    with open_gguf(big) as f:
        assert f.byte_order == ">" and list(f.tensors) == ["a.weight", "b.weight", "c.weight"]
    with pytest.raises(InputError, match=r"big\.gguf.*big-endian"):
        read_gguf(big)


def _data_end(path) -> int:
    with open_gguf(path) as f:
        return max(info.start + info.nbytes for info in f.tensors.values())


def test_every_cut_raises_input_error(tmp_path):
    """Any cut before the last tensor byte fails to open; the metadata alone reads or fails."""
    whole = _write(tmp_path / "whole.gguf")
    data, want = whole.read_bytes(), read_metadata(whole)
    cut = tmp_path / "cut.gguf"
    for keep in range(0, _data_end(whole), 5):
        cut.write_bytes(data[:keep])
        with pytest.raises(InputError, match=r"cut\.gguf"):
            with open_gguf(cut):
                pass
        try:
            got = read_metadata(cut)
        except InputError as e:
            assert "cut.gguf" in str(e)
        else:  # cut after the key-value section
            assert got.keys() == want.keys()


def test_truncated_tensor_data_names_the_tensor(tmp_path):
    whole = _write(tmp_path / "whole.gguf")
    cut = tmp_path / "short.gguf"
    cut.write_bytes(whole.read_bytes()[:_data_end(whole) - 1])  # the writer pads after the data
    with pytest.raises(InputError, match=r"short\.gguf.*'c\.weight'.*truncated"):
        with open_gguf(cut):
            pass
    assert read_metadata(cut)["llama.block_count"] == 3  # the metadata alone is intact


def _raw_file(*kv: bytes, n_kv: int = 1) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, 0, n_kv) + b"".join(kv)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


@pytest.mark.parametrize("name, body, message", [
    ("version", b"GGUF" + struct.pack("<IQQ", 7, 0, 0), "version 7"),
    ("counts", b"GGUF" + struct.pack("<IQQ", 3, 2**40, 0), "corrupt"),
    ("vtype", _raw_file(_key("k") + struct.pack("<I", 99)), "unknown value type 99"),
    ("utf8", _raw_file(_key("k") + struct.pack("<IQ", T.STRING, 2) + b"\xff\xfe"), "UTF-8"),
    ("nesting", _raw_file(_key("k") + struct.pack("<I", T.ARRAY)
                          + struct.pack("<IQ", T.ARRAY, 1) * 40), "nests arrays"),
    ("longarray", _raw_file(_key("k") + struct.pack("<IIQ", T.ARRAY, T.STRING, 2**50)),
     "truncated or corrupt"),
])
def test_corrupt_headers(tmp_path, name, body, message):
    path = tmp_path / f"{name}.gguf"
    path.write_bytes(body)
    with pytest.raises(InputError, match=rf"{name}\.gguf.*{message}"):
        read_metadata(path, arrays=["k"])
    with pytest.raises(InputError, match=rf"{name}\.gguf"):
        read_metadata(path)


def test_bad_string_in_an_array_fails_only_when_decoded(tmp_path):
    path = tmp_path / "utf8array.gguf"
    path.write_bytes(_raw_file(_key("k") + struct.pack("<IIQQ", T.ARRAY, T.STRING, 1, 1) + b"\xff"))
    with pytest.raises(InputError, match=r"utf8array\.gguf.*'k'.*UTF-8"):
        read_metadata(path, arrays=["k"])
    assert read_metadata(path)["k"] == SkippedArray(1)


def test_missing_and_tiny_files(tmp_path):
    with pytest.raises(InputError, match=r"absent\.gguf"):
        read_metadata(tmp_path / "absent.gguf")
    (tmp_path / "tiny.gguf").write_bytes(b"GG")
    with pytest.raises(InputError, match=r"tiny\.gguf.*not a GGUF file"):
        read_metadata(tmp_path / "tiny.gguf")
    (tmp_path / "folder.gguf").mkdir()
    with pytest.raises(InputError, match=r"folder\.gguf"):
        read_metadata(tmp_path / "folder.gguf")
