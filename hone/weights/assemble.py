"""Hugging Face tensor names and layouts <-> hone parameter paths, and building a Transformer from
a source of named tensors without allocating random weights first.

Hugging Face stores a linear layer as `weight` [out, in]; hone keeps kernels as [in, out] with the
head axes split out (q: [D, N, H], o: [N, H, D]) so attention is written as einsums. Every hone
parameter maps to exactly one HF tensor, except a routed MLP's stacked experts ([E, D, F]),
which map to one tensor per expert as published checkpoints store them
(`mlp.experts.{e}.gate_proj.weight`; Mixtral `block_sparse_moe.experts.{e}.w1.weight`); the
table names them with a `{}` for the expert. transformers 5 fuses experts in memory
(`mlp.experts.gate_up_proj` [E, 2F, D], `mlp.experts.down_proj` [E, D, F]) but writes the
per-expert layout; hone writes that layout and reads both. The table is built from the
config, so each family's naming differences (Gemma 2/3's four norms per layer, Mixtral's
block_sparse_moe) live here once.
"""

from __future__ import annotations

import math
from typing import Callable, Protocol

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.config import ModelConfig
from hone.models.transformer import Transformer

Path = tuple  # a flat nnx state path, e.g. ("layers", 0, "attn", "q", "kernel")

# Layout kinds: "same" (identical), "in" (hone [in, *out] <-> HF [prod(out), in]),
# "out" (hone [*in, out] <-> HF [out, prod(in)]), "bias" (hone [N, H] <-> HF [N*H]),
# "experts" (hone [E, a, b] <-> E tensors [b, a], the name's {} the expert's index).


def hf_name_table(cfg: ModelConfig) -> dict[Path, tuple[str, str]]:
    """hone parameter path -> (HF tensor name, layout kind)."""
    table: dict[Path, tuple[str, str]] = {
        ("embedder", "embedding"): ("model.embed_tokens.weight", "same"),
        ("final_norm", "scale"): ("model.norm.weight", "same"),
    }
    if not cfg.tie_embeddings:
        table[("lm_head", "kernel")] = ("lm_head.weight", "in")
    gemma_norms = cfg.post_norms
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        L = ("layers", i)
        table[L + ("attn_norm", "scale")] = (p + "input_layernorm.weight", "same")
        for x in "qkv":
            table[L + ("attn", x, "kernel")] = (p + f"self_attn.{x}_proj.weight", "in")
            if cfg.attention_bias:
                table[L + ("attn", f"{x}_bias")] = (p + f"self_attn.{x}_proj.bias", "bias")
        table[L + ("attn", "o", "kernel")] = (p + "self_attn.o_proj.weight", "out")
        if cfg.qk_norm:
            table[L + ("attn", "q_norm", "scale")] = (p + "self_attn.q_norm.weight", "same")
            table[L + ("attn", "k_norm", "scale")] = (p + "self_attn.k_norm.weight", "same")
        if gemma_norms:
            table[L + ("attn_post_norm", "scale")] = (p + "post_attention_layernorm.weight",
                                                      "same")
            table[L + ("mlp_norm", "scale")] = (p + "pre_feedforward_layernorm.weight", "same")
            table[L + ("mlp_post_norm", "scale")] = (p + "post_feedforward_layernorm.weight",
                                                     "same")
        else:  # Llama/Qwen/Gemma call the pre-MLP norm "post_attention_layernorm"
            table[L + ("mlp_norm", "scale")] = (p + "post_attention_layernorm.weight", "same")
        if cfg.routed(i):
            table.update(_routed_names(cfg, p, L))
            continue
        table[L + ("mlp", "gate", "kernel")] = (p + "mlp.gate_proj.weight", "in")
        table[L + ("mlp", "up", "kernel")] = (p + "mlp.up_proj.weight", "in")
        table[L + ("mlp", "down", "kernel")] = (p + "mlp.down_proj.weight", "in")
    return table


def _routed_names(cfg: ModelConfig, p: str, L: tuple) -> dict[Path, tuple[str, str]]:
    """A routed MLP's router, experts and shared expert (hone/models/moe.py)."""
    mixtral = cfg.family == "mixtral"
    mlp = p + ("block_sparse_moe." if mixtral else "mlp.")
    table = {L + ("mlp", "router"): (mlp + "gate.weight", "in")}
    leaves = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
    for ours, theirs in zip(("gate", "up", "down"), leaves):
        table[L + ("mlp", ours)] = (mlp + "experts.{}." + theirs + ".weight", "experts")
    if cfg.moe.shared_expert_intermediate_size:
        for x in ("gate", "up", "down"):
            table[L + ("mlp", "shared", x, "kernel")] = (mlp + f"shared_expert.{x}_proj.weight",
                                                         "in")
        table[L + ("mlp", "shared_gate", "kernel")] = (mlp + "shared_expert_gate.weight", "in")
    return table


def _fused(template: str) -> tuple[str, int | None]:
    """transformers 5's in-memory tensor holding an expert tensor (its state_dict names):
    (name, 0 or 1 for the gate or up half of gate_up_proj's rows; None for down_proj)."""
    base = template.split("experts.")[0].replace(".block_sparse_moe.", ".mlp.") + "experts."
    leaf = template.split(".")[-2]
    if leaf in ("gate_proj", "w1", "up_proj", "w3"):
        return base + "gate_up_proj", 0 if leaf in ("gate_proj", "w1") else 1
    return base + "down_proj", None


def stored_name(name: str, available: set[str]) -> str:
    """The name a table entry's tensor has in this source: the published one, else the one
    transformers 5 uses when saving with save_original_format=False (Mixtral's
    block_sparse_moe renamed mlp)."""
    if name in available:
        return name
    other = name.replace(".block_sparse_moe.", ".mlp.")
    return other if other in available else name


def missing_names(name: str, kind: str, available: set[str], experts: int) -> list[str]:
    """The tensors a table entry needs that `available` lacks (experts: every per-expert
    tensor, unless the fused tensor is there)."""
    if kind != "experts":
        return [] if stored_name(name, available) in available else [name]
    if _fused(name)[0] in available:
        return []
    return [n for n in (name.format(e) for e in range(experts)) if n not in available]


def read_experts(source, template: str, shape: tuple[int, ...], experts: range) -> np.ndarray:
    """Experts `experts` of a stacked expert parameter of hone `shape` [E, a, b], in hone's
    layout [len(experts), a, b], from per-expert tensors [b, a] or transformers 5's fused one.
    Every tensor read is checked against the shape the config implies."""
    fused, half = _fused(template)
    per_expert = (shape[2], shape[1])
    if template.format(experts.start) in source.names():
        parts = []
        for e in experts:
            arr = source.get(template.format(e))
            _check(source, template.format(e), arr.shape, per_expert)
            parts.append(arr.T)
        return np.stack(parts)
    arr = source.get(fused)  # [E, 2F, D] (gate rows, then up rows) or [E, D, F]
    full = (shape[0], 2 * shape[2], shape[1]) if half is not None else (shape[0],) + per_expert
    _check(source, fused, arr.shape, full)
    arr = arr[experts.start:experts.stop]
    if half is not None:
        arr = arr[:, half * shape[2]:(half + 1) * shape[2]]
    return np.swapaxes(arr, 1, 2)


def _check(source, name: str, got, want) -> None:
    if tuple(got) != tuple(want):
        raise InputError(f"tensor {name!r} has shape {tuple(got)}, expected {tuple(want)} "
                         f"from the config", path=source.where(name))


def hf_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    """The HF shape of a hone parameter's tensor (experts: of each expert's tensor)."""
    if kind == "experts":
        return (shape[2], shape[1])
    if kind == "same":
        return tuple(shape)
    if kind == "in":
        return (math.prod(shape[1:]), shape[0])
    if kind == "out":
        return (shape[-1], math.prod(shape[:-1]))
    return (math.prod(shape),)


def to_hone(x: np.ndarray, shape: tuple[int, ...], kind: str) -> np.ndarray:
    if kind == "same":
        return x
    if kind == "bias":
        return x.reshape(shape)
    return x.T.reshape(shape)


def to_hf(x: np.ndarray, kind: str) -> np.ndarray:
    if kind == "same":
        return x
    if kind == "bias":
        return x.reshape(-1)
    if kind == "in":
        return np.ascontiguousarray(x.reshape(x.shape[0], -1).T)
    return np.ascontiguousarray(x.reshape(-1, x.shape[-1]).T)


class TensorSource(Protocol):
    """Named tensors in Hugging Face layout (a safetensors folder, a converted GGUF, a dict)."""

    def names(self) -> set[str]: ...
    def get(self, name: str) -> np.ndarray: ...
    def where(self, name: str) -> str: ...  # file the tensor comes from, for messages


class DictSource:
    def __init__(self, tensors: dict[str, np.ndarray], origin: str):
        self.tensors, self.origin = tensors, origin

    def names(self) -> set[str]:
        return set(self.tensors)

    def get(self, name: str) -> np.ndarray:
        return self.tensors[name]

    def where(self, name: str) -> str:
        return self.origin


def build_model(cfg: ModelConfig, source: TensorSource, dtype=jnp.float32,
                convert: Callable[[np.ndarray], jax.Array] | None = None) -> Transformer:
    """A Transformer whose parameters are the source's tensors (cast to dtype).

    The model is first built abstractly (jax.eval_shape), so no random weights are allocated;
    each tensor is checked against the shape the config implies before anything is converted.
    """
    table = hf_name_table(cfg)
    available = source.names()
    experts = cfg.moe.num_experts if cfg.moe is not None else 0
    # Names are checked before the abstract model is built, so a config that claims thousands
    # of layers against a file of a few tensors fails at once instead of after building them.
    missing = sorted(n for name, kind in table.values()
                     for n in missing_names(name, kind, available, experts))
    if missing:
        origin = source.where(missing[0])
        raise InputError(f"tensor {missing[0]!r} is missing ({len(missing)} missing in all)",
                         path=origin)
    abstract = nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    flat = nnx.to_flat_state(state)
    convert = convert or (lambda a: jnp.asarray(a, dtype=dtype))
    leaves = []
    for path, var in flat:
        name, kind = table[path]
        if kind == "experts":
            arr = read_experts(source, name, var.shape, range(var.shape[0]))
            leaves.append((path, var.replace(convert(arr))))
            continue
        name = stored_name(name, available)
        arr = source.get(name)
        want = hf_shape(var.shape, kind)
        if tuple(arr.shape) != want:
            raise InputError(f"tensor {name!r} has shape {tuple(arr.shape)}, expected {want} "
                             f"from the config", path=source.where(name))
        leaves.append((path, var.replace(convert(to_hone(arr, var.shape, kind)))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def hf_tensors(model: Transformer, dtype=None) -> dict[str, np.ndarray]:
    """The model's parameters as HF-named numpy arrays (optionally cast)."""
    table = hf_name_table(model.config)
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        name, kind = table[path]
        arr = np.asarray(jax.device_get(var[...]))
        if dtype is not None:
            arr = arr.astype(dtype)
        if kind == "experts":  # one [b, a] tensor per expert, as published checkpoints
            out.update({name.format(e): np.ascontiguousarray(arr[e].T)
                        for e in range(arr.shape[0])})
            continue
        out[name] = to_hf(arr, kind)
    return out
