"""Hostile Hugging Face folders (config.json + safetensors, one file or an index and shards):
`SafetensorsFolder` reads every tensor or raises InputError naming the file, and so does
`load_hf` end to end; `config_from_hf(read_json(...))` the same for any config.json.

The safetensors file is built here from its parts (an 8-byte header length, a JSON header of
name -> {dtype, shape, data_offsets}, the data), so a mutation can make any part lie: the header
length, a dtype (including ones numpy has no type for), a shape (2**40 elements, negative,
not a list), the data offsets, the tensor names; the index can point outside the folder or at
a missing shard; and the bytes may be cut or overwritten. Claimed sizes must be checked against
the file before anything is allocated.
"""

from __future__ import annotations

import functools
import json
import struct
from pathlib import Path

import numpy as np
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from fuzz_common import EXAMPLES, FUZZ, HOSTILE_INTS, Scratch, anywhere, clear_or_ok
from hone.models.config import ModelConfig
from hone.models.transformer import Transformer
from hone.weights.assemble import hf_name_table, hf_shape
from hone.weights.hf import SafetensorsFolder, load_hf, read_json
from hone.weights.hf_config import config_from_hf, config_to_hf

SCRATCH = Scratch("safetensors")
CONFIG = ModelConfig(family="llama", vocab_size=16, hidden_size=8, intermediate_size=16,
                     num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4)
_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16"}
ALL_DTYPES = ["F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8",
              "BOOL", "F8_E4M3", "F8_E5M2", "F8_E8M0", "E8M0", "F4", "F6_E2M3", "F6_E3M2",
              "C64", "f32", ""]


def _valid_tensors() -> dict[str, np.ndarray]:
    """The tensors of a random CONFIG model in HF layout, a third of them float16."""
    model = nnx.eval_shape(lambda: Transformer(CONFIG, rngs=nnx.Rngs(0)))
    shapes = {path: var.shape for path, var in nnx.to_flat_state(nnx.state(model))}
    rng = np.random.default_rng(0)
    out = {}
    for i, (path, (name, kind)) in enumerate(hf_name_table(CONFIG).items()):
        out[name] = rng.standard_normal(hf_shape(shapes[path], kind)).astype(
            np.float16 if i % 3 == 1 else np.float32)
    return out


TENSORS = _valid_tensors()


def _header(tensors: dict[str, np.ndarray]) -> tuple[dict, bytes]:
    header, data, offset = {"__metadata__": {"format": "pt"}}, b"", 0
    for name, arr in tensors.items():
        raw = arr.tobytes()
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    return header, data


def _file(header: dict | bytes, data: bytes, length: int | None = None) -> bytes:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)  # the alignment the reference writer uses
    return struct.pack("<Q", len(raw) if length is None else length) + raw + data


# ---- strategies ---------------------------------------------------------------------------------

hostile_int = st.sampled_from(HOSTILE_INTS) | st.integers(-2**64, 2**65)
json_junk = st.recursive(st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats()
                         | st.text(max_size=8),
                         lambda inner: st.lists(inner, max_size=3)
                         | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=5)

# Mutations of one file, weighted by repetition.
# "retype" and "reshape" keep the byte count, so the file stays valid for the safetensors
# library and the lie reaches hone's own checks (dtype, shape against the config).
MUTATIONS = (4 * ["retype", "reshape"] + 2 * ["dtype", "shape", "offsets"]
             + ["entry", "rename", "drop", "metadata", "length", "header"])
# (dtype, bytes per element) pairs a tensor may be reinterpreted as.
_RETYPES = [("F32", 4), ("F16", 2), ("BF16", 2), ("U8", 1), ("I64", 8), ("BOOL", 1),
            ("F8_E4M3", 1), ("F8_E5M2", 1), ("F64", 8), ("C64", 8), ("I32", 4)]


@functools.cache
def _valid_parts(names: tuple[str, ...]) -> tuple[str, bytes]:
    header, data = _header({n: TENSORS[n] for n in names})
    return json.dumps(header), data


@functools.cache
def _valid_file(names: tuple[str, ...]) -> bytes:
    text, data = _valid_parts(names)
    return _file(text.encode(), data)


@st.composite
def hostile_safetensors(draw, names: tuple[str, ...]) -> bytes:
    text, data = _valid_parts(names)
    header, valid = json.loads(text), json.loads(text)
    length = None
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(MUTATIONS))
        name = draw(st.sampled_from(names))
        entry = header.get(name)
        if not isinstance(entry, dict) and what in ("retype", "reshape", "dtype", "shape",
                                                     "offsets"):
            continue
        if what == "retype":
            start, end = valid[name]["data_offsets"]
            dtype, size = draw(st.sampled_from(_RETYPES))
            if (end - start) % size == 0:
                entry.update(dtype=dtype, shape=[(end - start) // size])
        elif what == "reshape":
            shape = valid[name]["shape"]
            count = int(np.prod(shape))
            entry.update(dtype=valid[name]["dtype"], shape=draw(st.sampled_from(
                [[count], [1, count], [count, 1], list(reversed(shape)),
                 [2, count // 2] if count % 2 == 0 else [count], [count, 1, 1, 1]])))
        elif what == "dtype":
            entry["dtype"] = draw(st.sampled_from(ALL_DTYPES) | json_junk)
        elif what == "shape":
            entry["shape"] = draw(st.lists(hostile_int | st.integers(0, 64), max_size=5)
                                  | json_junk)
        elif what == "offsets":
            start, end = valid[name]["data_offsets"]
            entry["data_offsets"] = draw(st.lists(hostile_int, max_size=3)
                                         | st.sampled_from([[end, start], [start, end + 4],
                                                            [start + 4, end + 4]]) | json_junk)
        elif what == "entry":
            header[name] = draw(json_junk)
        elif what == "rename" and name in header:
            header[draw(st.text(max_size=20) | st.sampled_from(names))] = header.pop(name)
        elif what == "drop":
            header.pop(name, None)
        elif what == "metadata":
            header["__metadata__"] = draw(json_junk)
        elif what == "length":
            length = draw(hostile_int.map(lambda n: n % 2**64))
        elif what == "header":
            return _file(draw(st.binary(max_size=64) | json_junk.map(
                lambda v: json.dumps(v).encode())), data, draw(st.none() | hostile_int.map(
                    lambda n: n % 2**64)))
    out = bytearray(_file(header, data, length))
    if draw(st.integers(0, 5)) == 5:  # overwrite a few bytes
        for _ in range(draw(st.integers(1, 3))):
            at = draw(anywhere) % len(out)
            chunk = draw(st.binary(min_size=1, max_size=8))
            out[at:at + len(chunk)] = chunk
    if draw(st.integers(0, 5)) == 5:  # cut anywhere
        out = out[:draw(anywhere) % (len(out) + 1)]
    return bytes(out)


@st.composite
def hostile_configs(draw) -> dict:
    """config.json contents: the valid one with a few keys given hostile values."""
    config = json.loads(json.dumps(config_to_hf(CONFIG)))
    keys = list(config) + ["rope_scaling", "layer_types", "sliding_window", "use_sliding_window",
                           "max_window_layers", "query_pre_attn_scalar", "rope_local_base_freq"]
    for _ in range(draw(st.integers(0, 3))):
        key = draw(st.sampled_from(keys))
        config[key] = draw(
            st.sampled_from([0, -1, 1, 2, 3, 1000, 60000, 2**40, 2**63, 1e308, float("nan"),
                             float("inf"), True, None, "", "llama", "gemma3_text", "qwen2", [],
                             {}])
            | hostile_int | json_junk
            | st.fixed_dictionaries({"rope_type": st.sampled_from(["llama3", "linear", "yarn"]),
                                     "factor": json_junk})
            | st.fixed_dictionaries({"full_attention": json_junk}))
    return config


@st.composite
def hostile_folders(draw) -> Path:
    """A folder: config.json (maybe hostile), and one safetensors file or an index + shards."""
    sharded = draw(st.booleans())
    # Two folders, each always holding the same files (overwritten), so nothing is removed.
    folder = SCRATCH.folder("hostile-sharded" if sharded else "hostile-single")
    config = draw(hostile_configs()) if draw(st.integers(0, 3)) == 3 else config_to_hf(CONFIG)
    (folder / "config.json").write_text(json.dumps(config))
    names = tuple(TENSORS)
    if not sharded:
        (folder / "model.safetensors").write_bytes(draw(hostile_safetensors(names)))
        return folder
    cut = draw(st.integers(1, len(names) - 1))
    shards = {"a.safetensors": names[:cut], "b.safetensors": names[cut:]}
    weight_map = {n: f for f, ns in shards.items() for n in ns}
    for _ in range(draw(st.integers(0, 2))):
        name = draw(st.sampled_from(names + ("model.extra.weight",)))
        weight_map[name] = draw(st.sampled_from(
            ["c.safetensors", "../hostile-sharded/a.safetensors", "/dev/null", "/", "..", ".",
             "config.json", ""]) | json_junk)
    index = {"metadata": {}, "weight_map": weight_map}
    if draw(st.integers(0, 7)) == 7:
        index = draw(json_junk)
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    hostile = draw(st.sampled_from(sorted(shards)))  # one shard lies, the other is valid
    for shard, ns in shards.items():
        (folder / shard).write_bytes(draw(hostile_safetensors(ns)) if shard == hostile
                                     else _valid_file(ns))
    return folder


# ---- properties ---------------------------------------------------------------------------------

def _read_tensors(folder) -> None:
    source = SafetensorsFolder(folder)
    for name in sorted(source.names()):
        source.get(name)
        source.get_slice(name).get_shape()


def test_the_valid_folder_loads():
    folder = SCRATCH.folder("valid")
    (folder / "config.json").write_text(json.dumps(config_to_hf(CONFIG)))
    (folder / "model.safetensors").write_bytes(_valid_file(tuple(TENSORS)))
    model = load_hf(folder)
    assert model.config.num_layers == 1
    _read_tensors(folder)


@FUZZ
@given(folder=hostile_folders())
def test_hostile_safetensors_folders(folder):
    """Every tensor of the folder, read whole and as a lazy slice."""
    assert EXAMPLES >= 2000
    clear_or_ok(lambda: _read_tensors(folder), folder.name)


# End to end, also checking each tensor against the shapes the config implies. Each case that
# gets that far builds the model abstractly (jax.eval_shape, ~20 ms), so fewer cases run here;
# the file-level reading above and config.json below run 2,000 each.
@settings(FUZZ, max_examples=EXAMPLES // 5)
@given(folder=hostile_folders())
def test_hostile_folders_load_end_to_end(folder):
    clear_or_ok(lambda: load_hf(folder), folder.name)


@FUZZ
@given(config=hostile_configs().map(json.dumps) | json_junk.map(json.dumps) | st.binary(max_size=64)
       | st.sampled_from(["[" * 100_000, '{"hidden_size": ' + "9" * 5000 + "}", "\xff"]))
def test_hostile_config_json(config):
    path = SCRATCH.write("config.json", config)
    clear_or_ok(lambda: config_from_hf(read_json(path), str(path)), str(path))
