"""hone models out as GGUF files (llama.cpp's format): the architecture's metadata, the tensors
under llama.cpp's names and layouts, quantised, written whole or not at all.

`write_gguf(model, path, quant, vocab)` is the entry point; `vocab` is the tokenizer's metadata
(`hone.weights.gguf_vocab`). It is the inverse of the reader, `hone.weights.gguf`:

- Names come from the reader's own table (`hf_names`), inverted, so the two cannot drift apart.
  Experts are stacked back into llama.cpp's `ffn_*_exps` [E, out, in].
- The two converter fixes the reader undoes are redone: Llama-family (arch `llama`, Mixtral too)
  Q/K rows are permuted into llama.cpp's interleaved rotary order, and Gemma norms are stored as
  `1 + w`. Qwen and Gemma use llama.cpp's NEOX rotary, whose row order is Hugging Face's.
- Before a byte is written, the header is read back through the reader's `hf_config` and
  `config_from_hf` and must give the model's own config: anything llama.cpp's keys cannot say (a
  Gemma 3 layer pattern other than every sixth layer global, Llama 3 rope scaling, which llama.cpp
  keeps only as per-frequency factors the reader cannot invert, a query scale llama.cpp derives
  differently) is refused by field name instead of written as a different model. Every tensor's
  rows are checked against its quantisation block the same way.
- The file goes to a temporary sibling (`.NAME.tmp-PID`) that replaces `path` only after the
  caller's `check` accepted it, so an interrupted or refused export leaves nothing behind.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFValueType as VT, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as QT

from hone.errors import InputError
from hone.models.config import ModelConfig
from hone.weights.assemble import hf_tensors
from hone.weights.gguf import hf_config, hf_names
from hone.weights.gguf_format import TensorInfo
from hone.weights.gguf_quant import QUANT_TYPES, check_quant, check_rows, encode, plan_type
from hone.weights.hf_config import config_from_hf, config_to_hf

# HF model_type -> llama.cpp architecture
ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
         "gemma2": "gemma2", "gemma3_text": "gemma3", "qwen3_moe": "qwen3moe",
         "qwen2_moe": "qwen2moe", "mixtral": "llama"}

Metadata = dict[str, tuple[Any, VT]]  # key -> (value, type); arrays: (list, element type)


class _Writer(GGUFWriter):
    """gguf's writer, able to write an empty array too: a byte-level vocabulary without merges
    (the tiny presets') still needs `tokenizer.ggml.merges`, which llama.cpp requires."""

    def _pack_val(self, val: Any, vtype: VT, add_vtype: bool, sub_type: VT | None = None) -> bytes:
        if vtype == VT.ARRAY and len(val) == 0 and sub_type is not None:
            head = self._pack("I", vtype) if add_vtype else b""
            return head + self._pack("I", sub_type) + self._pack("Q", 0)
        return super()._pack_val(val, vtype, add_vtype, sub_type)


def _arch(cfg: ModelConfig) -> str:
    if cfg.family not in ARCHS:
        raise InputError(f"model family {cfg.family!r} has no GGUF layout in hone; it writes "
                         f"{', '.join(ARCHS)}", key="model.family")
    return ARCHS[cfg.family]


def model_metadata(cfg: ModelConfig, quant: str) -> Metadata:
    """The architecture's keys under llama.cpp's names (`{arch}.block_count`, ...)."""
    arch = _arch(cfg)
    p, u32, f32 = f"{arch}.", VT.UINT32, VT.FLOAT32
    meta: Metadata = {
        "general.name": (f"hone {cfg.family}", VT.STRING),
        "general.file_type": (QUANT_TYPES[quant][1], u32),
        "general.quantization_version": (2, u32),
        p + "vocab_size": (cfg.vocab_size, u32),
        p + "context_length": (cfg.max_position_embeddings, u32),
        p + "embedding_length": (cfg.hidden_size, u32),
        p + "block_count": (cfg.num_layers, u32),
        p + "feed_forward_length": (cfg.intermediate_size, u32),
        p + "attention.head_count": (cfg.num_heads, u32),
        p + "attention.head_count_kv": (cfg.num_kv_heads, u32),
        p + "attention.key_length": (cfg.head_dim, u32),
        p + "attention.value_length": (cfg.head_dim, u32),
        p + "rope.dimension_count": (cfg.head_dim, u32),
        p + "attention.layer_norm_rms_epsilon": (cfg.norm_eps, f32),
        p + "rope.freq_base": (cfg.rope_theta, f32),
    }
    s = cfg.rope_scaling
    if s is not None:
        if s.kind != "linear":
            raise InputError(f"rope scaling {s.kind!r} cannot be written: llama.cpp keeps Llama 3 "
                             f"scaling as per-frequency factors ('rope_freqs.weight') that no "
                             f"reader turns back into the config; export --format hf instead",
                             key="rope_scaling")
        meta[p + "rope.scaling.type"] = ("linear", VT.STRING)
        meta[p + "rope.scaling.factor"] = (s.factor, f32)
    if cfg.sliding_window and cfg.family in ("gemma2", "gemma3_text"):
        meta[p + "attention.sliding_window"] = (cfg.sliding_window, u32)
    if cfg.family == "gemma3_text":
        local = cfg.rope_local_theta if cfg.rope_local_theta is not None else cfg.rope_theta
        meta[p + "rope.freq_base_swa"] = (local, f32)
    for name, cap in (("attn_logit_softcapping", cfg.attn_logit_softcap),
                      ("final_logit_softcapping", cfg.final_logit_softcap)):
        if cap is not None:
            meta[p + name] = (cap, f32)
    m = cfg.moe
    if m is not None:
        meta[p + "expert_count"] = (m.num_experts, u32)
        meta[p + "expert_used_count"] = (m.num_experts_per_tok, u32)
        if cfg.family != "mixtral":
            meta[p + "expert_feed_forward_length"] = (m.moe_intermediate_size, u32)
            meta[p + "expert_weights_norm"] = (m.norm_topk_prob, VT.BOOL)
        if m.shared_expert_intermediate_size:
            meta[p + "expert_shared_feed_forward_length"] = (m.shared_expert_intermediate_size,
                                                             u32)
    return meta


def _permute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """HF Q/K rows -> llama.cpp's order (what its converter's `permute` does; the reader's
    `_unpermute_rotary` undoes it). [n_heads*H, D] -> same shape: per head (half, i) -> (i, half)."""
    rows, cols = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_tensors(model) -> dict[str, np.ndarray]:
    """The model's parameters as float32 arrays under llama.cpp's names, in the file's layout
    (numpy order: [out, in] matrices, experts [E, out, in], vectors [n])."""
    cfg: ModelConfig = model.config
    arch = _arch(cfg)
    hf = hf_tensors(model, np.float32)
    view = config_to_hf(cfg)  # the keys hf_names reads, as the reader would see the file
    if cfg.moe is not None:
        view["mlp_only_layers"] = [i for i in range(cfg.num_layers) if not cfg.routed(i)]
    out = {}
    for gname, hname in hf_names(arch, view).items():
        if "{}" in hname:
            x = np.stack([hf.pop(hname.format(e)) for e in range(cfg.moe.num_experts)])
        elif hname in hf:
            x = hf.pop(hname)
        else:
            continue  # output.weight of a tied model, biases of a model without them
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            x = _permute_rotary(x, cfg.num_heads if "attn_q" in gname else cfg.num_kv_heads)
        elif cfg.family.startswith("gemma") and gname.endswith("norm.weight"):
            x = x + np.float32(1.0)  # llama.cpp multiplies by the stored weight alone
        elif gname.endswith("ffn_gate_inp_shexp.weight"):
            x = x.reshape(-1)  # HF [1, D]; llama.cpp declares the shared expert's gate [D]
        out[gname] = np.ascontiguousarray(x, dtype=np.float32)
    if hf:
        raise InputError(f"parameter {next(iter(hf))!r} has no GGUF name for {arch}",
                         key="model")
    return out


def _layer(gname: str) -> int | None:
    return int(gname.split(".")[1]) if gname.startswith("blk.") else None


def _plan(tensors: dict[str, np.ndarray], quant: str, n_layers: int) -> dict[str, QT]:
    """Each tensor's storage type; every quantised tensor's rows checked against its block."""
    tied = "output.weight" not in tensors
    types = {}
    for name, x in tensors.items():
        # llama.cpp quantises a tied embedding as the output projection it also is
        as_name = "output.weight" if tied and name == "token_embd.weight" else name
        qtype = plan_type(as_name, x.shape, quant, _layer(name), n_layers)
        check_rows(name, x.shape, qtype)
        types[name] = qtype
    return types


def _check_header(cfg: ModelConfig, arch: str, meta: Metadata, tensors: dict[str, np.ndarray],
                  types: dict[str, QT], path: Path) -> None:
    """Refuse a file whose header the reader would turn into a different model."""
    values = {k: v for k, (v, _) in meta.items()}
    infos = {}
    for name, x in tensors.items():
        block, size = GGML_QUANT_SIZES[types[name]]
        infos[name] = TensorInfo(name, tuple(reversed(x.shape)), types[name], 0,
                                 x.size // block * size)
    got = config_from_hf(hf_config(arch, values, infos, path), str(path))
    want = _canonical(cfg)
    got = _canonical(got)
    diff = [f.name for f in dataclasses.fields(ModelConfig)
            if getattr(got, f.name) != getattr(want, f.name)]
    if diff:
        details = "; ".join(f"{k}: the model has {getattr(want, k)!r}, llama.cpp's keys would "
                            f"give {getattr(got, k)!r}" for k in diff[:3])
        raise InputError(f"the {arch} GGUF layout cannot hold this model ({details})",
                         path=str(path), key=diff[0])


def _canonical(cfg: ModelConfig) -> ModelConfig:
    """One spelling of configs that compute the same thing (defaults made explicit, the dense
    layers of an MoE listed rather than derived from decoder_sparse_step)."""
    changes: dict[str, Any] = {}
    if cfg.family == "gemma3_text" and cfg.rope_local_theta is None:
        changes["rope_local_theta"] = cfg.rope_theta
    if cfg.query_pre_attn_scalar is not None and cfg.query_pre_attn_scalar == cfg.head_dim:
        changes["query_pre_attn_scalar"] = None
    if "sliding" not in cfg.layer_types:
        changes["sliding_window"] = None
    if cfg.moe is not None:
        dense = tuple(i for i in range(cfg.num_layers) if not cfg.routed(i))
        changes["moe"] = dataclasses.replace(cfg.moe, mlp_only_layers=dense,
                                             decoder_sparse_step=1)
    return cfg.replace(**changes)


def write_gguf(model, path: str | os.PathLike, quant: str, vocab: Metadata,
               check: Callable[[Path], None] | None = None) -> Path:
    """Write `model` with tokenizer metadata `vocab` as one GGUF file of export type `quant`.

    Everything is checked before the first byte; `check(tmp_path)` may inspect the finished
    temporary file and raise to refuse it. `path` appears only when complete.
    """
    check_quant(quant)
    path = Path(path)
    if path.suffix != ".gguf":
        raise InputError("a GGUF export is one file; name it NAME.gguf", path=str(path),
                         key="--out")
    if path.is_symlink() or (path.exists() and not path.is_file()):
        raise InputError("exists and is not a file; choose a new .gguf path", path=str(path),
                         key="--out")
    cfg: ModelConfig = model.config
    arch = _arch(cfg)
    meta = {**model_metadata(cfg, quant), **vocab}
    tensors = gguf_tensors(model)
    types = _plan(tensors, quant, cfg.num_layers)
    _check_header(cfg, arch, meta, tensors, types, path)
    vocab_rows = len(vocab.get("tokenizer.ggml.tokens", ([],))[0])
    if vocab_rows and vocab_rows != cfg.vocab_size:
        raise InputError(f"the tokenizer has {vocab_rows} tokens but the model's embedding "
                         f"{cfg.vocab_size} rows", key="tokenizer.ggml.tokens")

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    writer = _Writer(tmp, arch)
    try:
        for key, (value, vtype) in meta.items():
            if isinstance(value, list):
                writer.add_key_value(key, value, VT.ARRAY, sub_type=vtype)
            else:
                writer.add_key_value(key, value, vtype)
        for name, x in tensors.items():
            data = encode(x, types[name])
            writer.add_tensor(name, data, raw_dtype=types[name] if data.dtype == np.uint8
                              else None)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()  # (again in `finally`: a no-op once closed)
        if check is not None:
            check(tmp)
        os.replace(tmp, path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return path
