"""GGUF files (llama.cpp's format) turned into what a Hugging Face checkpoint folder holds.

`read_gguf(path)` returns `(hf_config, tensors)`: a dict shaped like that model's HF `config.json`
and a dict from HF parameter names (`model.layers.0.self_attn.q_proj.weight`, [out, in] like a torch
Linear) to dense numpy arrays. Everything downstream then sees one input format, whether the
weights came from safetensors or from a GGUF file. The container itself (header, metadata, tensor
directory, bounds checks) is parsed by `hone.weights.gguf_format`; `shipped_gguf_path` lives in
`hone.weights.shipped` and is re-exported here.

Design choices:
- Architectures "llama" (SmolLM2, Llama), "qwen2", "qwen3", "gemma", "gemma2" and "gemma3", and
  the mixture-of-experts "qwen3moe", "qwen2moe" and Mixtral ("llama" with `llama.expert_count`),
  whose config keys, tensor names and stacked expert tensors `hone.weights.gguf_moe` owns.
  `hf_names` is public: the writer (`hone.weights.gguf_write`) inverts the same table. Anything else is refused by name rather
  than loaded half-right: a wrong tensor layout gives a model that runs and talks nonsense.
- Vocabulary string arrays are not decoded here (the tokenizer reads them): `open_gguf` skips them.
- Dequantization is `gguf.quants.dequantize`, the code transformers' own GGUF loader calls, so
  the weights agree with it bit for bit (checked in tests/weights/test_shipped.py).
- Two fixes undo what llama.cpp's converter does: Llama Q/K rows are stored with the rotary
  halves interleaved, and Gemma norm weights are stored with the +1 of `(1 + w)` folded in.
  Each was once missed, and the model still ran: loss on English prose 4.06 nats per token
  without the Q/K permutation (2.59 with), 18.7 without the norm fix (2.48 with).
- One tensor at a time: raw bytes stay memory-mapped, and each tensor is dequantized, fixed and
  cast to `dtype` before the next, so only one tensor's float32 scratch copy exists beside the
  result.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

from hone.errors import InputError
from hone.weights import gguf_moe
from hone.weights.gguf_format import GGUFFile, TensorInfo, meta_value, open_gguf
from hone.weights.shipped import SHIPPED_MODELS, shipped_gguf_path

__all__ = ["DENSE_ARCHS", "SHIPPED_MODELS", "hf_config", "hf_names", "read_gguf", "shipped_gguf_path"]

# llama.cpp architecture -> HF model_type of the dense families read here
DENSE_ARCHS = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma": "gemma",
               "gemma2": "gemma2", "gemma3": "gemma3_text"}
_GEMMA_ARCHS = ("gemma", "gemma2", "gemma3")
_HF_CLASSES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
               "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
               "gemma2": "Gemma2ForCausalLM"}


# ----------------------------------------------------------------------------------------------
# Config




def hf_config(arch: str, meta: dict[str, Any], infos: dict[str, TensorInfo],
              path: Path) -> dict[str, Any]:
    """The HF `config.json` dict a GGUF file with this metadata and tensor directory holds
    (public: the writer checks its own header with it before writing)."""
    p = f"{arch}."
    if "token_embd.weight" not in infos:
        raise InputError("the file has no 'token_embd.weight' tensor", path=str(path))
    embed = infos["token_embd.weight"]
    if len(embed.dims) != 2:
        raise InputError("the token embedding is not 2-D", path=str(path), key=embed.name)
    # The embedding matrix is the truth for the vocabulary size; the metadata key is optional.
    vocab, hidden = embed.shape
    if vocab == 0 or hidden == 0:
        raise InputError(f"the token embedding has shape {[vocab, hidden]}", path=str(path),
                         key=embed.name)
    if meta_value(meta, p + "embedding_length", path) != hidden:
        raise InputError(f"{p}embedding_length is {meta[p + 'embedding_length']} but the token "
                         f"embedding is {hidden} wide", path=str(path))
    declared_vocab = meta_value(meta, p + "vocab_size", path, default=vocab)
    if declared_vocab != vocab:
        raise InputError(f"{p}vocab_size is {declared_vocab} but the token embedding has {vocab} "
                         f"rows", path=str(path))
    heads = meta_value(meta, p + "attention.head_count", path, positive=True)
    kv_heads = meta_value(meta, p + "attention.head_count_kv", path, default=heads, positive=True)
    head_dim = meta_value(meta, p + "attention.key_length", path, default=hidden // heads,
                          positive=True)
    if head_dim % 2:
        raise InputError(f"head dim {head_dim} is odd; rotary embeddings need it even",
                         path=str(path))
    value_dim = meta_value(meta, p + "attention.value_length", path, default=head_dim)
    if value_dim != head_dim:
        raise InputError(f"key length {head_dim} and value length {value_dim} differ; HF "
                         f"{arch} models use one head_dim", path=str(path))
    rotary_dim = meta_value(meta, p + "rope.dimension_count", path, default=head_dim)
    if rotary_dim != head_dim:
        raise InputError(f"rotary dimension {rotary_dim} is not the head dim {head_dim} (partial "
                         f"rotary embeddings are not supported)", path=str(path))

    config: dict[str, Any] = {
        "vocab_size": vocab,
        "hidden_size": hidden,
        "intermediate_size": meta_value(meta, p + "feed_forward_length", path, positive=True),
        "num_hidden_layers": meta_value(meta, p + "block_count", path, positive=True),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "rms_norm_eps": meta_value(meta, p + "attention.layer_norm_rms_epsilon", path, kind=float),
        # llama.cpp's own default when the key is absent.
        "rope_theta": meta_value(meta, p + "rope.freq_base", path, default=10000.0, kind=float),
        "max_position_embeddings": meta_value(meta, p + "context_length", path, positive=True),
        "tie_word_embeddings": "output.weight" not in infos,
        "bos_token_id": meta_value(meta, "tokenizer.ggml.bos_token_id", path, default=None),
        "eos_token_id": meta_value(meta, "tokenizer.ggml.eos_token_id", path, default=None),
        "pad_token_id": meta_value(meta, "tokenizer.ggml.padding_token_id", path, default=None),
        "attention_bias": False,
        "rope_scaling": _rope_scaling(meta, p, infos, path),
    }
    if config["num_hidden_layers"] > len(infos):
        # Checked before anything loops over layers: a corrupt count must not build huge tables.
        raise InputError(f"{p}block_count is {config['num_hidden_layers']} but the file holds "
                         f"only {len(infos)} tensors", path=str(path))
    if heads % kv_heads:
        raise InputError(f"{heads} attention heads are not a multiple of {kv_heads} KV heads",
                         path=str(path))

    if gguf_moe.is_moe(arch, meta):
        config.update(gguf_moe.moe_config(arch, meta, infos, path, config))
        return config
    if arch in _HF_CLASSES:
        config.update(model_type=DENSE_ARCHS[arch], architectures=[_HF_CLASSES[arch]])
        if arch in ("gemma", "gemma2"):
            config["hidden_activation"] = "gelu_pytorch_tanh"
        elif arch == "llama":
            config.update(hidden_act="silu", mlp_bias=False)
        else:  # qwen2 (q/k/v biases), qwen3
            config.update(hidden_act="silu", use_sliding_window=False,
                          attention_bias=arch == "qwen2")
        if arch == "gemma2":  # llama.cpp: even layers slide; the 27B (46 layers) scales by D/N
            config.update(
                sliding_window=meta_value(meta, p + "attention.sliding_window", path,
                                          positive=True),
                layer_types=["sliding_attention" if i % 2 == 0 else "full_attention"
                             for i in range(config["num_hidden_layers"])],
                query_pre_attn_scalar=(hidden // heads) if config["num_hidden_layers"] == 46
                else head_dim,
                attn_logit_softcapping=meta_value(meta, p + "attn_logit_softcapping", path,
                                                  default=None, kind=float),
                final_logit_softcapping=meta_value(meta, p + "final_logit_softcapping", path,
                                                   default=None, kind=float))
        return config

    # gemma3
    n_layers = config["num_hidden_layers"]
    pattern_key = p + "attention.sliding_window_pattern"
    if isinstance(meta.get(pattern_key), np.ndarray):  # newer converters: a flag per layer
        sliding = [bool(x) for x in meta[pattern_key]]
        if len(sliding) != n_layers:
            raise InputError(f"has {len(sliding)} entries for {n_layers} layers", path=str(path),
                             key=pattern_key)
    else:  # Gemma 3: every 6th layer (1-based) attends globally; llama.cpp hard-codes the 6
        every = meta_value(meta, pattern_key, path, default=6, positive=True)
        sliding = [(i + 1) % every != 0 for i in range(n_layers)]
    config.update(
        model_type="gemma3_text",
        architectures=["Gemma3ForCausalLM"],
        hidden_activation="gelu_pytorch_tanh",
        # Local layers use base 10000; GGUF files only record it in newer converters.
        rope_local_base_freq=meta_value(meta, p + "rope.freq_base_swa", path, default=10000.0,
                                        kind=float),
        sliding_window=meta_value(meta, p + "attention.sliding_window", path, positive=True),
        # Not stored in GGUF. Every Gemma 3 size scales queries by head_dim**-0.5 except the 27B
        # (62 layers), which uses (hidden/heads)**-0.5; llama.cpp decides the same way.
        query_pre_attn_scalar=(hidden // heads) if n_layers == 62 else head_dim,
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        final_logit_softcapping=None,
        attn_logit_softcapping=None,
    )
    return config


def _rope_scaling(meta: dict[str, Any], p: str, infos: dict[str, TensorInfo],
                  path: Path) -> dict[str, Any] | None:
    """HF `rope_scaling` from GGUF metadata; kinds the file cannot fully describe are refused."""
    if "rope_freqs.weight" in infos:
        # Llama 3.1+ frequency scaling: llama.cpp keeps only the resulting per-frequency factors,
        # not the parameters HF's config needs. Refusing beats a model with the wrong positions.
        raise InputError("the file stores Llama 3 rope frequency factors ('rope_freqs.weight'); "
                         "this reader cannot turn them back into an HF rope_scaling config. Load "
                         "the Hugging Face checkpoint instead", path=str(path))
    kind = meta_value(meta, p + "rope.scaling.type", path, default="none", kind=str)
    if kind == "none":
        return None
    if kind == "linear":
        return {"rope_type": "linear",
                "factor": meta_value(meta, p + "rope.scaling.factor", path, kind=float)}
    raise InputError(f"rope scaling {kind!r} is not supported (only 'linear')", path=str(path),
                     key=p + "rope.scaling.type")


# ----------------------------------------------------------------------------------------------
# Tensors


def hf_names(arch: str, config: dict[str, Any]) -> dict[str, str]:
    """GGUF tensor name -> HF parameter name, for every tensor the architecture has."""
    n_layers = config["num_hidden_layers"]
    names = {"token_embd.weight": "model.embed_tokens.weight",
             "output_norm.weight": "model.norm.weight",
             "output.weight": "lm_head.weight"}
    per_layer = {
        "attn_norm": "input_layernorm",
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
        "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
        "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    }
    if arch == "qwen3":
        per_layer.update(attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
    if arch not in ("gemma2", "gemma3"):
        per_layer["ffn_norm"] = "post_attention_layernorm"
    else:
        # Gemma 3 norms around both sub-blocks. Note the name shift: llama.cpp's "ffn_norm" is
        # the norm *before* the MLP, and its "post_attention_norm" is HF's post_attention_layernorm.
        per_layer.update(post_attention_norm="post_attention_layernorm",
                         ffn_norm="pre_feedforward_layernorm",
                         post_ffw_norm="post_feedforward_layernorm")
        if arch == "gemma3":
            per_layer.update(attn_q_norm="self_attn.q_norm", attn_k_norm="self_attn.k_norm")
    if gguf_moe.num_experts(config):
        names.update(gguf_moe.moe_names(config))
    for i in range(n_layers):
        routed = f"blk.{i}.ffn_gate_inp.weight" in names  # its MLP: gguf_moe's names
        for g, h in per_layer.items():
            if not (routed and g in ("ffn_gate", "ffn_up", "ffn_down")):
                names[f"blk.{i}.{g}.weight"] = f"model.layers.{i}.{h}.weight"
        if arch == "qwen2":
            for x in "qkv":
                names[f"blk.{i}.attn_{x}.bias"] = f"model.layers.{i}.self_attn.{x}_proj.bias"
    return names


def _hf_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF parameter name -> the shape the config implies (norms [D], projections [out, in])."""
    v, d, f = config["vocab_size"], config["hidden_size"], config["intermediate_size"]
    n, k, h = (config["num_attention_heads"], config["num_key_value_heads"], config["head_dim"])
    shapes = {"model.embed_tokens.weight": (v, d), "model.norm.weight": (d,),
              "lm_head.weight": (v, d)}
    per_layer = {
        "input_layernorm": (d,), "post_attention_layernorm": (d,),
        "pre_feedforward_layernorm": (d,), "post_feedforward_layernorm": (d,),
        "self_attn.q_norm": (h,), "self_attn.k_norm": (h,),
        "self_attn.q_proj": (n * h, d), "self_attn.k_proj": (k * h, d),
        "self_attn.v_proj": (k * h, d), "self_attn.o_proj": (d, n * h),
        "mlp.gate_proj": (f, d), "mlp.up_proj": (f, d), "mlp.down_proj": (d, f),
    }
    biases = {"q_proj": (n * h,), "k_proj": (k * h,), "v_proj": (k * h,)}
    for i in range(config["num_hidden_layers"]):
        for name, shape in per_layer.items():
            shapes[f"model.layers.{i}.{name}.weight"] = shape
        for x, shape in biases.items():
            shapes[f"model.layers.{i}.self_attn.{x}.bias"] = shape
    if gguf_moe.num_experts(config):
        shapes.update(gguf_moe.moe_shapes(config))
    return shapes


def _unpermute_rotary(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row order. [n_heads*H, D] -> same shape, HF rotary layout.

    HF rotates the first half of each head against the second half; llama.cpp's kernels rotate
    adjacent pairs, so its converter reorders each head's rows from (half, i) to (i, half).
    Reading them back as (i, half) and swapping the two axes restores HF's order.
    """
    rows, cols = w.shape
    half = rows // n_heads // 2
    return w.reshape(n_heads, half, 2, cols).swapaxes(1, 2).reshape(rows, cols)


@functools.cache
def _can_dequantize(qtype: GGMLQuantizationType) -> bool:
    """Whether gguf.quants implements this type, probed on one zero block (public API only)."""
    block, type_size = GGML_QUANT_SIZES[qtype]
    try:
        dequantize(np.zeros((1, type_size), np.uint8), qtype)
    except NotImplementedError:
        return False
    return True


def read_gguf(path: str | os.PathLike, dtype: Any = np.float32
              ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a llama, qwen2, qwen3, gemma, gemma2, gemma3, qwen3moe or qwen2moe GGUF file
    (Mixtral's too) as
    `(hf_config, {hf_name: array of dtype})`.

    Quantized tensors are dequantized; shapes follow HF ([out, in] for projections, one tensor
    per expert).
    """
    path = Path(path)
    dtype = np.dtype(dtype)
    if dtype.kind != "f" and dtype.name != "bfloat16":
        raise InputError(f"dtype must be a floating type, got {dtype}", key="dtype")
    with open_gguf(path) as file:
        return _convert(file, dtype)


def _convert(file: GGUFFile, dtype: np.dtype) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    path, meta, infos = file.path, file.metadata, file.tensors
    if file.byte_order != "<":
        # gguf.quants reads little-endian blocks only.
        raise InputError("big-endian GGUF files are not supported; convert the model again on "
                         "a little-endian machine", path=str(path))
    arch = meta.get("general.architecture")
    known = (*DENSE_ARCHS, *gguf_moe.MOE_ARCHS)
    if not isinstance(arch, str) or arch not in known:  # (an array compares per item)
        raise InputError(f"architecture {arch!r} is not supported; this reader knows 'llama' "
                         f"(Llama, SmolLM2, Mixtral), 'qwen2', 'qwen3', 'gemma', 'gemma2', "
                         f"'gemma3', 'qwen3moe' and 'qwen2moe'",
                         path=str(path), key="general.architecture")
    config = hf_config(arch, meta, infos, path)
    names = hf_names(arch, config)
    shapes = _hf_shapes(config)

    unknown = sorted(set(infos) - set(names))
    if unknown:
        raise InputError(f"tensor(s) {', '.join(unknown[:5])} are not part of the {arch} layout "
                         f"this reader knows", path=str(path), key=unknown[0])
    optional = {"output.weight"}  # absent when the output projection is tied to the embedding
    missing = [g for g in names if g not in infos and g not in optional]
    if missing:
        raise InputError(f"{len(missing)} tensor(s) missing, first {missing[0]!r}",
                         path=str(path), key=missing[0])

    tensors: dict[str, np.ndarray] = {}
    for gname, info in infos.items():
        hname = names[gname]
        want = shapes[hname]
        if not gguf_moe.stored_shape(hname, info.shape, want):
            raise InputError(f"tensor has shape {list(info.shape)} (HF {hname}), but the "
                             f"metadata implies {list(want)}", path=str(path), key=gname)
        if not _can_dequantize(info.qtype):
            raise InputError(f"tensor type {info.qtype.name} cannot be dequantized",
                             path=str(path), key=gname)
        block, type_size = GGML_QUANT_SIZES[info.qtype]
        row_bytes = info.dims[0] // block * type_size
        # [rows, bytes per row]: the byte layout dequantize expects, a view into the mmap.
        raw = file.tensor_bytes(info).reshape(-1, row_bytes)
        values = dequantize(raw, info.qtype).reshape(want)  # float32
        if arch == "llama" and gname.endswith(("attn_q.weight", "attn_k.weight")):
            n = config["num_attention_heads"] if "attn_q" in gname else config[
                "num_key_value_heads"]
            values = _unpermute_rotary(values, n)
        elif arch in _GEMMA_ARCHS and gname.endswith("norm.weight"):
            # Gemma computes x * (1 + w); llama.cpp stores 1 + w so its kernel can multiply by
            # the weight alone. All six Gemma 3 norms carry the offset, q_norm/k_norm included:
            # on the shipped 270M, loss on English prose is 1.94 nats with all shifted, 3.08 with
            # q/k norms left alone, 18-20 with none or only q/k shifted.
            values = values - np.float32(1.0)
        out = values.astype(dtype, copy=False)
        if np.may_share_memory(out, raw):
            out = out.copy()  # F32 tensors come back as views of the mmap, which closes soon
        del raw, values
        tensors.update(gguf_moe.split_experts(hname, out))
    return config, tensors
