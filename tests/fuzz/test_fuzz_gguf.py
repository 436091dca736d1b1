"""Hostile GGUF files: `read_metadata`, `open_gguf` and `read_gguf` (+ `config_from_hf`) either
read them or raise InputError naming the file.

The files are built field by field here (not with `gguf.GGUFWriter`), from a valid one-layer
llama model, so that a mutation can make any single header field lie: counts, key and string
lengths, value types, array counts, tensor dimension counts, dimensions (up to 2**64 - 1, far
beyond the file), ggml types, data offsets, the alignment. On top of that the bytes may be cut
at any offset or overwritten. Sizes the header claims must be checked against the file before
anything is allocated, so none of these cases may take noticeable memory or time.
"""

from __future__ import annotations

import struct

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT, GGUFValueType as T
from hypothesis import given
from hypothesis import strategies as st

from fuzz_common import EXAMPLES, FUZZ, HOSTILE_INTS, Scratch, anywhere, clear_or_ok
from hone.weights.gguf import read_gguf
from hone.weights.gguf_format import open_gguf, read_metadata
from hone.weights.hf_config import config_from_hf

SCRATCH = Scratch("gguf")
V, D, N, K, H, F = 16, 8, 2, 1, 4, 16  # vocab, hidden, heads, kv heads, head dim, MLP width
ALIGN = 32

_SCALAR = {T.UINT8: "B", T.INT8: "b", T.UINT16: "H", T.INT16: "h", T.UINT32: "I", T.INT32: "i",
           T.FLOAT32: "f", T.BOOL: "?", T.UINT64: "Q", T.INT64: "q", T.FLOAT64: "d"}


def _string(raw: bytes, length: int | None = None) -> bytes:
    return struct.pack("<Q", len(raw) if length is None else length) + raw


def _value(vtype: T, value) -> bytes:
    """The payload of one metadata value (after its type code)."""
    if vtype == T.STRING:
        return _string(value.encode())
    if vtype == T.ARRAY:
        item_type, items = value
        return struct.pack("<IQ", item_type, len(items)) + b"".join(
            _value(item_type, item) for item in items)
    return struct.pack("<" + _SCALAR[vtype], value)


def _valid_spec() -> dict:
    """A valid one-layer llama file as editable fields: magic, version, kv list, tensor list."""
    u32 = T.UINT32
    kv = [("general.architecture", T.STRING, _value(T.STRING, "llama")),
          ("llama.block_count", u32, _value(u32, 1)),
          ("llama.context_length", u32, _value(u32, 64)),
          ("llama.embedding_length", u32, _value(u32, D)),
          ("llama.feed_forward_length", u32, _value(u32, F)),
          ("llama.attention.head_count", u32, _value(u32, N)),
          ("llama.attention.head_count_kv", u32, _value(u32, K)),
          ("llama.attention.layer_norm_rms_epsilon", T.FLOAT32, _value(T.FLOAT32, 1e-5)),
          ("llama.rope.freq_base", T.FLOAT32, _value(T.FLOAT32, 10000.0)),
          ("tokenizer.ggml.bos_token_id", u32, _value(u32, 1)),
          ("tokenizer.ggml.tokens", T.ARRAY,
           _value(T.ARRAY, (T.STRING, [f"t{i}" for i in range(V)]))),
          ("tokenizer.ggml.scores", T.ARRAY, _value(T.ARRAY, (T.FLOAT32, [-float(i) for i in
                                                                         range(V)])))]
    dims = {"token_embd.weight": (D, V), "output_norm.weight": (D,),
            "blk.0.attn_norm.weight": (D,), "blk.0.ffn_norm.weight": (D,),
            "blk.0.attn_q.weight": (D, N * H), "blk.0.attn_k.weight": (D, K * H),
            "blk.0.attn_v.weight": (D, K * H), "blk.0.attn_output.weight": (N * H, D),
            "blk.0.ffn_gate.weight": (D, F), "blk.0.ffn_up.weight": (D, F),
            "blk.0.ffn_down.weight": (F, D)}
    rng = np.random.default_rng(0)
    tensors, offset = [], 0
    for i, (name, shape) in enumerate(dims.items()):
        qtype = QT.F16 if i % 3 == 1 else QT.F32
        data = rng.standard_normal(int(np.prod(shape))).astype(
            np.float16 if qtype == QT.F16 else np.float32).tobytes()
        tensors.append({"name": name.encode(), "dims": list(shape), "n_dims": None,
                        "qtype": int(qtype), "offset": offset, "data": data})
        offset += -(-len(data) // ALIGN) * ALIGN
    return {"magic": b"GGUF", "version": 3, "n_tensors": None, "n_kv": None, "kv": kv,
            "key_lengths": {}, "tensors": tensors}


def _serialize(spec: dict) -> bytes:
    kv, tensors = spec["kv"], spec["tensors"]
    n_tensors = len(tensors) if spec["n_tensors"] is None else spec["n_tensors"]
    n_kv = len(kv) if spec["n_kv"] is None else spec["n_kv"]
    out = bytearray(spec["magic"] + struct.pack("<IQQ", spec["version"], n_tensors, n_kv))
    for i, (key, vtype, payload) in enumerate(kv):
        raw = key if isinstance(key, bytes) else key.encode()
        out += _string(raw, spec["key_lengths"].get(i)) + struct.pack("<I", vtype) + payload
    for t in tensors:
        n_dims = len(t["dims"]) if t["n_dims"] is None else t["n_dims"]
        out += _string(t["name"]) + struct.pack("<I", n_dims)
        out += b"".join(struct.pack("<Q", d) for d in t["dims"])
        out += struct.pack("<IQ", t["qtype"], t["offset"])
    out += bytes(-len(out) % ALIGN)
    data_start = len(out)
    for t in tensors:  # each tensor's bytes where its (true) offset put them
        end = data_start + t.get("true_offset", t["offset"])
        if end > len(out):
            out += bytes(end - len(out))
        out[end:end + len(t["data"])] = t["data"]
    return bytes(out)


VALID = _serialize(_valid_spec())

# ---- strategies ---------------------------------------------------------------------------------

hostile_int = st.sampled_from(HOSTILE_INTS) | st.integers(0, 2**64 - 1)
u32 = hostile_int.map(lambda n: n % 2**32)
raw_keys = (st.text(max_size=12).map(str.encode) | st.binary(max_size=12)
            | st.sampled_from([b"general.alignment", b"\xff\xfe", b"llama.block_count"]))


@st.composite
def well_formed_values(draw) -> tuple[int, bytes]:
    """(type code, payload) of a well-formed value of a type or size the reader may not expect:
    negative or huge counts, NaN and infinite floats, strings, one- or two-element arrays."""
    vtype = draw(st.sampled_from(sorted(_SCALAR) + [T.STRING, T.ARRAY]))
    if vtype == T.STRING:
        return int(vtype), _value(vtype, draw(st.sampled_from(["llama", "gemma3", "linear", "",
                                                               "yarn"]) | st.text(max_size=8)))
    if vtype == T.ARRAY:
        item_type = draw(st.sampled_from([T.UINT32, T.INT32, T.FLOAT32, T.BOOL, T.UINT64]))
        items = draw(st.lists(st.sampled_from([0, 1, 2, 6]), max_size=3))
        if item_type == T.FLOAT32:
            items = [float(x) for x in items]
        elif item_type == T.BOOL:
            items = [bool(x) for x in items]
        return int(vtype), _value(vtype, (item_type, items))
    code = _SCALAR[vtype]
    if code in "fd":
        value = draw(st.sampled_from([0.0, -1.0, 1e-6, float("nan"), float("inf"), 1e38])
                     | st.floats(width=32 if code == "f" else 64))
    elif code == "?":
        value = draw(st.booleans())
    else:
        bits = struct.calcsize(code) * 8
        low, high = ((-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if code.islower()
                     else (0, 2**bits - 1))
        value = draw(st.sampled_from([low, high, 0, 1, 2, 3, 4, 8, 16]) | st.integers(low, high))
    return int(vtype), struct.pack("<" + code, value)


@st.composite
def lying_values(draw) -> tuple[int, bytes]:
    """(type code, payload) of a value whose string length, array count or type code lies."""
    kind = draw(st.sampled_from(["string", "array", "nested", "garbage"]))
    if kind == "string":
        return int(T.STRING), _string(draw(st.binary(max_size=16)), draw(st.none() | hostile_int))
    if kind == "array":
        item_type = draw(st.sampled_from(sorted(_SCALAR) + [T.STRING]) | u32)
        count = draw(hostile_int | st.integers(0, 8))
        return int(T.ARRAY), struct.pack("<IQ", item_type, count) + draw(st.binary(max_size=64))
    if kind == "nested":
        depth = draw(st.integers(1, 20))
        head = b"".join(struct.pack("<IQ", T.ARRAY, draw(st.sampled_from([0, 1, 2, 2**40])))
                        for _ in range(depth))
        return int(T.ARRAY), head[4:]
    return draw(u32), draw(st.binary(max_size=24))


hostile_values = well_formed_values() | lying_values()


def _tensor_index(draw, spec) -> int:
    return draw(st.integers(0, len(spec["tensors"]) - 1))


# Header fields a mutation may make lie, weighted by repetition: a broken magic or version stops
# the reader at once, so those are drawn rarely and the ones reaching the model checks often.
MUTATIONS = (4 * ["value", "dims", "qtype", "add_value", "offset"]
             + 2 * ["n_dims", "name", "key", "drop_tensor", "dup_tensor", "alignment",
                    "key_length", "counts"] + ["version", "magic"])


@st.composite
def hostile_files(draw) -> bytes:
    spec = _valid_spec()
    kv, tensors = spec["kv"], spec["tensors"]
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(MUTATIONS))
        if what == "counts":
            spec[draw(st.sampled_from(["n_tensors", "n_kv"]))] = draw(hostile_int)
        elif what == "version":
            spec["version"] = draw(st.sampled_from([1, 2, 3, 4, 3 << 24, 2 << 24]) | u32)
        elif what == "magic":
            spec["magic"] = draw(st.binary(min_size=4, max_size=4))
        elif what == "value":  # a known key gets a value of another type, or one that lies
            i = draw(st.integers(0, len(kv) - 1))
            kv[i] = (kv[i][0], *draw(hostile_values))
        elif what == "add_value":
            kv.insert(draw(st.integers(0, len(kv))), (draw(raw_keys), *draw(hostile_values)))
        elif what == "key_length":
            spec["key_lengths"][draw(st.integers(0, len(kv) - 1))] = draw(hostile_int)
        elif what == "key":  # rename a key: a required one goes missing, or a name repeats
            i = draw(st.integers(0, len(kv) - 1))
            kv[i] = (draw(raw_keys | st.sampled_from([k for k, _, _ in kv])), *kv[i][1:])
        elif what == "dims":  # reversed keeps the byte count: the lie reaches the shape check
            t = tensors[_tensor_index(draw, spec)]
            t["dims"] = draw(st.just(t["dims"][::-1])
                             | st.lists(hostile_int | st.integers(0, 40), max_size=5))
        elif what == "n_dims":
            tensors[_tensor_index(draw, spec)]["n_dims"] = draw(u32 | st.integers(0, 6))
        elif what == "qtype":  # any ggml type (quantized, integer, dequantizable or not) or junk
            tensors[_tensor_index(draw, spec)]["qtype"] = draw(
                st.sampled_from([int(q) for q in GGML_QUANT_SIZES]) | u32)
        elif what == "offset":
            t = tensors[_tensor_index(draw, spec)]
            t.setdefault("true_offset", t["offset"])  # where its bytes still go
            t["offset"] = draw(hostile_int | st.integers(0, 2000))
        elif what == "name":
            t = tensors[_tensor_index(draw, spec)]
            t["name"] = draw(st.binary(max_size=24) | st.sampled_from(
                [b"\xff", b"output.weight", b"rope_freqs.weight", b"blk.7.attn_q.weight",
                 tensors[0]["name"]]))
        elif what == "drop_tensor" and len(tensors) > 1:
            del tensors[_tensor_index(draw, spec)]
        elif what == "dup_tensor":
            tensors.append(dict(tensors[_tensor_index(draw, spec)]))
        elif what == "alignment":
            kv.append(("general.alignment", *draw(
                st.sampled_from([(int(T.UINT32), struct.pack("<I", a)) for a in
                                 (0, 1, 3, 8, 64, 2**31)]) | hostile_values)))
    data = bytearray(_serialize(spec))
    if draw(st.integers(0, 3)) == 3:  # overwrite a few bytes anywhere after the magic
        for _ in range(draw(st.integers(1, 3))):
            at = 4 + draw(anywhere) % max(len(data) - 4, 1)
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[at:at + len(chunk)] = chunk
    if draw(st.integers(0, 3)) == 3:  # cut at any offset
        data = data[:draw(anywhere) % (len(data) + 1)]
    return bytes(data)


# ---- properties ---------------------------------------------------------------------------------

def _read_everything(path) -> None:
    read_metadata(path, arrays=["tokenizer.ggml.tokens", "general.architecture"])
    with open_gguf(path) as f:
        for info in f.tensors.values():
            assert f.tensor_bytes(info).nbytes == info.nbytes
    config, tensors = read_gguf(path)
    config_from_hf(config, str(path))


def test_the_valid_file_reads():
    path = SCRATCH.write("valid.gguf", VALID)
    config, tensors = read_gguf(path)
    cfg = config_from_hf(config, str(path))
    assert (cfg.num_layers, cfg.hidden_size, cfg.vocab_size) == (1, D, V)
    assert tensors["model.embed_tokens.weight"].shape == (V, D)


# One well-formed value of each kind a metadata key may wrongly hold.
WRONG_VALUES = [
    (T.STRING, "x"), (T.STRING, "llama"), (T.UINT32, 0), (T.UINT32, 2**32 - 1), (T.INT32, -1),
    (T.UINT64, 2**64 - 1), (T.INT8, -128), (T.FLOAT32, float("nan")), (T.FLOAT32, float("inf")),
    (T.FLOAT32, -1.0), (T.FLOAT64, 1e300), (T.BOOL, True), (T.ARRAY, (T.UINT32, [1, 2])),
    (T.ARRAY, (T.UINT32, [])), (T.ARRAY, (T.FLOAT32, [float("nan")])),
    (T.ARRAY, (T.STRING, ["llama", "llama"])), (T.ARRAY, (T.BOOL, [True])),
    (T.ARRAY, (T.INT32, [-1, -1]))]


def test_every_key_with_every_wrong_kind_of_value():
    """Exhaustively, beside the random cases: each metadata key of the valid file holding each
    kind of value (a string where a count belongs, an array where a name belongs, NaN, -1)."""
    for i in range(len(_valid_spec()["kv"])):
        for vtype, value in WRONG_VALUES:
            spec = _valid_spec()
            spec["kv"][i] = (spec["kv"][i][0], int(vtype), _value(vtype, value))
            path = SCRATCH.write("wrong.gguf", _serialize(spec))
            clear_or_ok(lambda: _read_everything(path), "wrong.gguf")


@FUZZ
@given(data=hostile_files())
def test_hostile_gguf_files(data):
    assert EXAMPLES >= 2000
    path = SCRATCH.write("hostile.gguf", data)
    clear_or_ok(lambda: _read_everything(path), "hostile.gguf")
