"""llama.cpp's mixture-of-experts GGUF files: the config keys, tensor names and shapes that
`hone.weights.gguf` adds for `qwen3moe`, `qwen2moe` and Mixtral (arch `llama` with
`llama.expert_count`).

The layout, checked against the gguf package's constants.py / tensor_mapping.py and llama.cpp's
loader (`create_tensor` shapes, written there innermost dimension first):
- `blk.N.ffn_gate_inp.weight`, the router: ggml [D, E], numpy [E, D]: HF `gate.weight`.
- `blk.N.ffn_{gate,up}_exps.weight`: ggml [D, F, E], numpy [E, F, D]; `ffn_down_exps`: ggml
  [F, D, E], numpy [E, D, F]. The converter stacks the experts' HF weights ([F, D] and [D, F])
  along a new leading axis, so expert e's slice is its HF tensor unchanged.
- Qwen2-MoE's shared expert: `ffn_{gate,up,down}_shexp` (one dense gated MLP of width
  `expert_shared_feed_forward_length`) and its gate `ffn_gate_inp_shexp`, HF [1, D], which
  llama.cpp declares as [D]; a file may hold either shape.
- A layer without `ffn_gate_inp` holds a dense MLP (`ffn_gate`, `ffn_up`, `ffn_down`), as the
  converter names a Qwen-MoE `mlp_only_layers` layer; it becomes an HF `mlp_only_layers` entry.
  (llama.cpp itself routes every layer of these architectures.)

The reader hands experts to the HF loader one tensor per expert under the published names
(`mlp.experts.{e}.gate_proj.weight`, Mixtral `block_sparse_moe.experts.{e}.w1.weight`): a `{}`
in a name here stands for the expert, and `split_experts` fills it in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from hone.errors import InputError
from hone.weights.gguf_format import TensorInfo, meta_value

MOE_ARCHS = ("qwen2moe", "qwen3moe")  # MoE-only architectures; Mixtral rides on "llama"


def is_moe(arch: str, meta: dict[str, Any]) -> bool:
    """Whether the file is one of the MoE layouts read here."""
    return arch in MOE_ARCHS or (arch == "llama" and "llama.expert_count" in meta)


def num_experts(config: dict[str, Any]) -> int:
    """Experts per routed layer of an HF config dict; 0 for a dense model."""
    return config.get("num_experts") or config.get("num_local_experts") or 0


def routed_layers(n_layers: int, infos: dict[str, TensorInfo]) -> list[int]:
    """The layers holding a router; the others hold a dense MLP."""
    return [i for i in range(n_layers) if f"blk.{i}.ffn_gate_inp.weight" in infos]


def moe_config(arch: str, meta: dict[str, Any], infos: dict[str, TensorInfo], path: Path,
               config: dict[str, Any]) -> dict[str, Any]:
    """The HF config keys of an MoE file, on top of the attention/norm keys `config` holds."""
    p = f"{arch}."
    n_layers = config["num_hidden_layers"]
    experts = meta_value(meta, p + "expert_count", path, positive=True)
    used = meta_value(meta, p + "expert_used_count", path, positive=True)
    if used > experts:
        raise InputError(f"{p}expert_used_count {used} exceeds {p}expert_count {experts}",
                         path=str(path), key=p + "expert_used_count")
    scale = meta_value(meta, p + "expert_weights_scale", path, default=1.0, kind=float)
    if scale not in (0.0, 1.0):  # 0: llama.cpp's "unset". Neither family scales its routing
        # weights, so an HF config cannot hold a scale: refused rather than dropped
        raise InputError(f"expert weights scaled by {scale} are not supported", path=str(path),
                         key=p + "expert_weights_scale")
    routed = routed_layers(n_layers, infos)
    if not routed:
        raise InputError(f"{p}expert_count is {experts} but no layer has a router "
                         f"('blk.N.ffn_gate_inp.weight')", path=str(path))
    dense = [i for i in range(n_layers) if i not in routed]

    if arch == "llama":  # Mixtral: experts as wide as feed_forward_length, every layer routed
        if dense:
            raise InputError(f"layer {dense[0]} has no router; Mixtral routes every layer",
                             path=str(path), key=f"blk.{dense[0]}.ffn_gate_inp.weight")
        width = meta_value(meta, p + "expert_feed_forward_length", path,
                           default=config["intermediate_size"], positive=True)
        if width != config["intermediate_size"]:
            raise InputError(f"expert width {width} differs from {p}feed_forward_length "
                             f"{config['intermediate_size']}; Mixtral has one width",
                             path=str(path), key=p + "expert_feed_forward_length")
        return dict(model_type="mixtral", architectures=["MixtralForCausalLM"],
                    hidden_act="silu", num_local_experts=experts, num_experts_per_tok=used,
                    # llama.cpp writes no window for Mixtral, and the released models have none
                    sliding_window=None)

    # Not stored by the converter: llama.cpp's graphs hard-code the renormalisation
    # (qwen3moe: on, qwen2moe: off), which newer converters may record as expert_weights_norm.
    # For qwen3moe this is not the HF class default (False) but what llama.cpp computes and
    # what every released Qwen3-MoE config says (norm_topk_prob: true).
    norm = meta.get(p + "expert_weights_norm", arch == "qwen3moe")
    if not isinstance(norm, (bool, np.bool_)):
        raise InputError(f"expected true or false, got {norm!r}", path=str(path),
                         key=p + "expert_weights_norm")
    family = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe"}[arch]
    out = dict(model_type=family, architectures=[
        {"qwen2_moe": "Qwen2MoeForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM"}[family]],
        hidden_act="silu", num_experts=experts, num_experts_per_tok=used,
        moe_intermediate_size=meta_value(meta, p + "expert_feed_forward_length", path, positive=True),
        norm_topk_prob=bool(norm), mlp_only_layers=dense, decoder_sparse_step=1,
        use_sliding_window=False)
    if arch == "qwen2moe":
        # The key is absent from early qwen2moe files; the shared expert's tensor is the truth.
        shexp = infos.get(f"blk.{routed[0]}.ffn_gate_shexp.weight")
        # (`...`: no tensor to read it from, so the key is required)
        width = shexp.shape[0] if shexp is not None and len(shexp.shape) == 2 else ...
        out.update(shared_expert_intermediate_size=meta_value(
                       meta, p + "expert_shared_feed_forward_length", path, default=width,
                       positive=True),
                   qkv_bias="blk.0.attn_q.bias" in infos)
    return out


def moe_names(config: dict[str, Any]) -> dict[str, str]:
    """GGUF -> HF names of the tensors MoE families add or rename (routed MLPs, Qwen's
    attention extras); `{}` in an HF name stands for the expert."""
    family, names = config["model_type"], {}
    mlp = "block_sparse_moe" if family == "mixtral" else "mlp"
    leaves = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    dense = set(config.get("mlp_only_layers", ()))
    for i in range(config["num_hidden_layers"]):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        if family == "qwen3_moe":
            names[b + "attn_q_norm.weight"] = h + "self_attn.q_norm.weight"
            names[b + "attn_k_norm.weight"] = h + "self_attn.k_norm.weight"
        if family == "qwen2_moe" and config["qkv_bias"]:
            for x in "qkv":
                names[b + f"attn_{x}.bias"] = h + f"self_attn.{x}_proj.bias"
        if i in dense:
            continue
        names[b + "ffn_gate_inp.weight"] = h + f"{mlp}.gate.weight"
        for g, leaf in zip(("gate", "up", "down"), leaves):
            names[b + f"ffn_{g}_exps.weight"] = h + f"{mlp}.experts.{{}}.{leaf}.weight"
        if family == "qwen2_moe":
            for g in ("gate", "up", "down"):
                names[b + f"ffn_{g}_shexp.weight"] = h + f"mlp.shared_expert.{g}_proj.weight"
            names[b + "ffn_gate_inp_shexp.weight"] = h + "mlp.shared_expert_gate.weight"
    return names


def moe_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """HF name -> shape for `moe_names`' tensors; experts [E, F, D] (down: [E, D, F]) stacked
    as the file holds them, under their `{}` name."""
    d, h = config["hidden_size"], config["head_dim"]
    n, k = config["num_attention_heads"], config["num_key_value_heads"]
    e = num_experts(config)
    f = config.get("moe_intermediate_size") or config["intermediate_size"]
    fs = config.get("shared_expert_intermediate_size", 0)
    shapes = {}
    for gname, hname in moe_names(config).items():
        kind = gname.split(".", 2)[2]
        shapes[hname] = {
            "attn_q_norm.weight": (h,), "attn_k_norm.weight": (h,),
            "attn_q.bias": (n * h,), "attn_k.bias": (k * h,), "attn_v.bias": (k * h,),
            "ffn_gate_inp.weight": (e, d),
            "ffn_gate_exps.weight": (e, f, d), "ffn_up_exps.weight": (e, f, d),
            "ffn_down_exps.weight": (e, d, f),
            "ffn_gate_shexp.weight": (fs, d), "ffn_up_shexp.weight": (fs, d),
            "ffn_down_shexp.weight": (d, fs), "ffn_gate_inp_shexp.weight": (1, d),
        }[kind]
    return shapes


def stored_shape(hname: str, got: tuple[int, ...], want: tuple[int, ...]) -> bool:
    """Whether a tensor stored with shape `got` holds HF `want`: equal, or the shared-expert
    gate as llama.cpp declares it ([D] for HF's [1, D])."""
    return got == want or (hname.endswith("shared_expert_gate.weight") and got == want[1:])


def split_experts(hname: str, values: np.ndarray) -> dict[str, np.ndarray]:
    """A stacked expert tensor [E, a, b] as one [a, b] tensor per expert (views, no copies)
    under its HF names; any other tensor under its own name."""
    if "{}" not in hname:
        return {hname: values}
    return {hname.format(e): values[e] for e in range(values.shape[0])}
