"""A tokenizer as GGUF metadata (`tokenizer.ggml.*`, `tokenizer.chat_template`) for the writer,
`hone.weights.gguf_write`.

Two sources:
- `copy_vocab(path)`: a model that came from a GGUF file (the shipped models included) keeps its
  file's tokenizer keys as they are: tokens, scores, types, merges, special ids and template are
  what llama.cpp wrote, and nothing is re-derived.
- `vocab_metadata(tokenizer, vocab_size)`: any other tokenizer is converted from its
  `tokenizers` backend (a Hugging Face `tokenizer.json`, or the byte-level one of the tiny
  presets). Byte-level BPE becomes llama.cpp's "gpt2" kind (tokens in GPT-2's byte alphabet,
  "left right" merges, the pre-tokenizer by llama.cpp's name); BPE with byte fallback
  (SentencePiece models such as Gemma) becomes the "llama" kind, whose scores are the merge
  ranks (a piece's score is minus the rank of the first merge that forms it, so "best score
  first" is the merge order).

Design choices:
- The tokenizer is duck-typed (`backend`, `bos_id`, `eos_id`, `pad_id`, `eos_ids`,
  `chat_template`): hone.tokenizer sits a floor above this package. Whether a converted file
  encodes like the original is checked by the export itself (hone/export.py reads the written
  file back with `Tokenizer.from_gguf` and compares ids), not guessed here.
- The vocabulary is padded to the embedding's rows with `[PAD{i}]` tokens of type UNUSED, as
  llama.cpp's converter does: llama.cpp requires one token per row.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
from gguf import GGUFValueType as VT

from hone.errors import InputError
from hone.weights.gguf_format import SkippedArray, read_metadata

# llama.cpp's token types (SentencePiece's piece types)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")

Metadata = dict[str, tuple[Any, VT]]


def copy_vocab(path) -> Metadata:
    """Every `tokenizer.*` key of a GGUF file, with its type."""
    keys = [k for k, v in read_metadata(path).items()
            if k.startswith("tokenizer.") and isinstance(v, SkippedArray)]
    meta = read_metadata(path, arrays=keys)
    out: Metadata = {}
    for key, value in meta.items():
        if not key.startswith("tokenizer."):
            continue
        if isinstance(value, np.ndarray):
            sub = {np.dtype(np.float32): VT.FLOAT32, np.dtype(np.int32): VT.INT32,
                   np.dtype(np.uint32): VT.UINT32, np.dtype(np.uint8): VT.UINT8,
                   np.dtype(np.int64): VT.INT64, np.dtype(np.bool_): VT.BOOL}.get(
                       value.dtype.newbyteorder("="))
            if sub is None:
                raise InputError(f"array of {value.dtype} cannot be copied", path=str(path),
                                 key=key)
            out[key] = (value.tolist(), sub)
        elif isinstance(value, list):
            if not all(isinstance(v, str) for v in value):
                raise InputError("nested arrays cannot be copied", path=str(path), key=key)
            out[key] = (value, VT.STRING)
        elif isinstance(value, bool):
            out[key] = (value, VT.BOOL)
        elif isinstance(value, int):
            out[key] = (value, VT.UINT32 if value >= 0 else VT.INT32)
        elif isinstance(value, float):
            out[key] = (value, VT.FLOAT32)
        else:
            out[key] = (value, VT.STRING)
    return out


def _pre_name(pre: dict | None, has_merges: bool) -> str:
    """llama.cpp's `tokenizer.ggml.pre` for a byte-level pre-tokenizer (tokenizer.json form)."""
    steps = [] if pre is None else (pre["pretokenizers"] if pre["type"] == "Sequence" else [pre])
    kinds = [s["type"] for s in steps]
    if kinds == ["ByteLevel"] and (steps[0].get("use_regex", True) or not has_merges):
        return "gpt2"  # (without merges every split gives the same ids: one per byte)
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits"):
        return "smollm"
    if kinds == ["Split", "ByteLevel"]:
        pattern = steps[0].get("pattern", {}).get("Regex", "")
        if r"\p{N}{1,3}" in pattern:
            return "llama-bpe"
        if r"\p{N}" in pattern:
            return "qwen2"
    raise InputError(f"the tokenizer's pre-tokenizer ({json.dumps(pre)[:120]}) is not one "
                     f"llama.cpp names; hone writes gpt2, smollm, llama-bpe and qwen2",
                     key="tokenizer.ggml.pre")


def vocab_metadata(tokenizer, vocab_size: int) -> Metadata:
    """llama.cpp's tokenizer keys for a `tokenizers`-backed tokenizer, padded to `vocab_size`."""
    spec = json.loads(tokenizer.backend.to_str())
    model = spec["model"]
    if model.get("type") != "BPE":
        raise InputError(f"tokenizer model {model.get('type')!r} cannot be written as GGUF; "
                         f"hone writes BPE (byte-level or with byte fallback)",
                         key="tokenizer.ggml.model")
    tokens = [f"[PAD{i}]" for i in range(vocab_size)]
    types = [UNUSED] * vocab_size
    entries = [(t, i, NORMAL) for t, i in model["vocab"].items()]
    entries += [(a["content"], a["id"], CONTROL if a["special"] else USER_DEFINED)
                for a in spec.get("added_tokens", [])]
    for token, i, kind in entries:
        if not 0 <= i < vocab_size:
            raise InputError(f"token {token!r} has id {i}, beyond the model's {vocab_size} "
                             f"embedding rows", key="tokenizer.ggml.tokens")
        tokens[i], types[i] = token, kind
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    meta: Metadata = {}
    if model.get("byte_fallback"):
        meta.update(_sentencepiece(spec, tokens, types, merges))
    else:
        meta["tokenizer.ggml.model"] = ("gpt2", VT.STRING)
        meta["tokenizer.ggml.pre"] = (_pre_name(spec.get("pre_tokenizer"), bool(merges)),
                                      VT.STRING)
        meta["tokenizer.ggml.tokens"] = (tokens, VT.STRING)
        meta["tokenizer.ggml.token_type"] = (types, VT.INT32)
        meta["tokenizer.ggml.merges"] = (merges, VT.STRING)  # llama.cpp requires it, even empty
    ids = {"bos_token_id": tokenizer.bos_id, "eos_token_id": tokenizer.eos_id,
           "padding_token_id": tokenizer.pad_id}
    unk = model.get("unk_token")
    if unk is not None:
        ids["unknown_token_id"] = model["vocab"].get(unk)
    extra = [i for i in tokenizer.eos_ids if i != tokenizer.eos_id]
    if extra:
        ids["eot_token_id"] = extra[0]  # the end of a chat turn, where llama.cpp stops too
    for key, value in ids.items():
        if value is not None:
            meta[f"tokenizer.ggml.{key}"] = (int(value), VT.UINT32)
    with_bos = tokenizer.backend.encode("a", add_special_tokens=True).ids
    plain = tokenizer.backend.encode("a", add_special_tokens=False).ids
    adds_bos = tokenizer.bos_id is not None and with_bos[:1] == [tokenizer.bos_id] != plain[:1]
    meta["tokenizer.ggml.add_bos_token"] = (bool(adds_bos), VT.BOOL)
    meta["tokenizer.ggml.add_eos_token"] = (False, VT.BOOL)
    if tokenizer.chat_template is not None:
        meta["tokenizer.chat_template"] = (tokenizer.chat_template, VT.STRING)
    return meta


def _sentencepiece(spec: dict, tokens: list[str], types: list[int],
                   merges: list[str]) -> Metadata:
    """The "llama" kind: pieces, scores from the merge ranks, piece types."""
    unk = spec["model"].get("unk_token")
    for i, token in enumerate(tokens):
        if types[i] == NORMAL and _BYTE_PIECE.fullmatch(token):
            types[i] = BYTE
        elif token == unk:
            types[i] = UNKNOWN
        elif types[i] == USER_DEFINED and set(token) == {"\u2581"}:
            # llama.cpp matches user-defined pieces in the raw text, before spaces become U+2581
            tokens[i] = token.replace("\u2581", " ")
    rank: dict[str, int] = {}
    for r, merge in enumerate(merges):
        rank.setdefault(merge.replace(" ", ""), r)
    n = len(merges)
    scores = [float(-rank.get(t, n + i)) for i, t in enumerate(tokens)]
    normalizer = json.dumps(spec.get("normalizer"))
    return {"tokenizer.ggml.model": ("llama", VT.STRING),
            "tokenizer.ggml.tokens": (tokens, VT.STRING),
            "tokenizer.ggml.scores": (scores, VT.FLOAT32),
            "tokenizer.ggml.token_type": (types, VT.INT32),
            "tokenizer.ggml.add_space_prefix": ('"Prepend"' in normalizer, VT.BOOL)}
