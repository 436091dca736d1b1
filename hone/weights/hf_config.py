"""Hugging Face `config.json` <-> ModelConfig, for model_type llama, qwen2, qwen3, gemma, gemma2
and gemma3_text, and the mixture-of-experts qwen3_moe, mixtral and qwen2_moe.

Reads both transformers 5.x configs (rotary settings in `rope_parameters`, per layer type for
Gemma 3) and older ones (top-level `rope_theta`, `rope_scaling`, `rope_local_base_freq`), and
writes both forms so old and new transformers load the export. Anything hone would compute
differently from the reference (an unknown rope type, a bias hone does not have) is refused with
the key's name rather than silently approximated.
"""

from __future__ import annotations

import math
from typing import Any

from hone.errors import InputError
from hone.models.config import MoE, ModelConfig, RopeScaling

FAMILIES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "qwen3_moe", "mixtral",
            "qwen2_moe")
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM",
                  "qwen3": "Qwen3ForCausalLM", "gemma": "GemmaForCausalLM",
                  "gemma2": "Gemma2ForCausalLM", "gemma3_text": "Gemma3ForCausalLM",
                  "qwen3_moe": "Qwen3MoeForCausalLM", "mixtral": "MixtralForCausalLM",
                  "qwen2_moe": "Qwen2MoeForCausalLM"}
_GEMMAS = ("gemma", "gemma2", "gemma3_text")
_MOES = ("qwen3_moe", "mixtral", "qwen2_moe")


# A corrupt layer count must not build per-layer tables of billions of entries; this is far
# above any model of these families (Llama 3.1 405B has 126 layers).
_MAX_LAYERS = 1 << 16


class _Reader:
    """Typed access to config keys; every problem names the file and the (dotted) key."""

    def __init__(self, d: dict, path: str, prefix: str = ""):
        self.d, self.path, self.prefix = d, path, prefix

    def error(self, message: str, key: str) -> InputError:
        return InputError(message, path=self.path, key=self.prefix + key)

    def get(self, key: str, kind: type, default: Any = ...) -> Any:
        if key not in self.d or self.d[key] is None:
            if default is ...:
                raise self.error("missing required key", key)
            return default
        value = self.d[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value) if abs(value) < 2**1000 else math.inf  # float() would overflow
        if kind is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise self.error(f"expected {kind.__name__}, got {_show(value)}", key)
        if kind is float and not math.isfinite(value):
            raise self.error(f"expected a finite number, got {value!r}", key)
        if kind in (int, float) and value <= 0 and key not in ("pad_token_id", "bos_token_id",
                                                              "eos_token_id"):
            raise self.error(f"must be positive, got {value!r}", key)
        return value

    def section(self, key: str) -> _Reader | None:
        """The object under `key` as a reader of its own (None when absent or null)."""
        value = self.d.get(key)
        if value is None:
            return None
        if not isinstance(value, dict):
            raise self.error(f"expected an object, got {_show(value)}", key)
        return _Reader(value, self.path, f"{self.prefix}{key}.")


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _rope_scaling(r: _Reader | None) -> RopeScaling | None:
    if r is None or not r.d:
        return None
    kind = r.d.get("rope_type", r.d.get("type", "default"))
    if kind == "default":
        return None
    if kind == "linear":
        return RopeScaling("linear", factor=r.get("factor", float))
    if kind == "llama3":
        low, high = r.get("low_freq_factor", float), r.get("high_freq_factor", float)
        if high <= low:  # the band between them is interpolated over high - low
            raise r.error(f"must be greater than low_freq_factor {low}, got {high}",
                          "high_freq_factor")
        return RopeScaling("llama3", r.get("factor", float), low, high,
                           r.get("original_max_position_embeddings", int))
    raise InputError(f"rope type {_show(kind)} is not supported; supported: default, linear, "
                     "llama3", path=r.path, key=r.prefix[:-1])


def _rope(r: _Reader, family: str) -> tuple[float, float | None, RopeScaling | None]:
    """(global theta, local theta, global scaling) from either config generation."""
    params = r.section("rope_parameters")
    if params is not None and "full_attention" in params.d:  # v5 Gemma 3: per layer type
        empty = _Reader({}, r.path)
        full = params.section("full_attention") or empty
        local = params.section("sliding_attention") or empty
        return (full.get("rope_theta", float, 1e6), local.get("rope_theta", float, 1e4),
                _rope_scaling(full))
    if params is not None and params.d:
        theta = params.get("rope_theta", float, r.get("rope_theta", float, 10000.0))
        scaling = _rope_scaling(params)
    else:
        theta = r.get("rope_theta", float, 1e6 if family == "gemma3_text" else 10000.0)
        scaling = _rope_scaling(r.section("rope_scaling"))
    local = r.get("rope_local_base_freq", float, 1e4) if family == "gemma3_text" else None
    return theta, local, scaling


def _layer_types(r: _Reader, family: str, num_layers: int) -> tuple[str, ...]:
    names = {"sliding_attention": "sliding", "full_attention": "global"}
    listed = r.d.get("layer_types")
    if family in ("qwen2", "qwen3") and not r.d.get("use_sliding_window", False):
        return ("global",) * num_layers
    if family in ("qwen3_moe", "qwen2_moe"):
        if r.d.get("use_sliding_window", False):
            raise r.error("sliding-window attention in MoE models is not supported",
                          "use_sliding_window")
        return ("global",) * num_layers
    if family == "mixtral":  # transformers slides every layer when sliding_window is set
        return ("sliding" if r.d.get("sliding_window") else "global",) * num_layers
    if listed is not None:
        if (not isinstance(listed, list) or len(listed) != num_layers
                or any(not isinstance(t, str) or t not in names for t in listed)):
            raise r.error(f"expected {num_layers} entries of {sorted(names)}, got "
                          f"{_show(listed)}", "layer_types")
        return tuple(names[t] for t in listed)
    if family == "gemma2":
        return tuple("sliding" if (i + 1) % 2 else "global" for i in range(num_layers))
    if family == "gemma3_text":
        every = r.get("sliding_window_pattern", int, 6)
        return tuple("sliding" if (i + 1) % every else "global" for i in range(num_layers))
    if family in ("qwen2", "qwen3"):  # older configs: sliding from max_window_layers upwards
        start = r.get("max_window_layers", int, num_layers)
        return tuple("sliding" if i >= start else "global" for i in range(num_layers))
    return ("global",) * num_layers


def config_from_hf(d: dict, path: str = "config.json") -> ModelConfig:
    """A ModelConfig from a parsed Hugging Face config.json (path is only for messages)."""
    if not isinstance(d, dict):
        raise InputError(f"expected a JSON object, got {_show(d)}", path=path)
    family = d.get("model_type")
    if family not in FAMILIES:
        raise InputError(f"model_type {_show(family)} is not supported; supported: "
                         f"{', '.join(FAMILIES)}", path=path, key="model_type")
    r = _Reader(d, path)
    hidden = r.get("hidden_size", int)
    heads = r.get("num_attention_heads", int)
    layers = r.get("num_hidden_layers", int)
    if layers > _MAX_LAYERS:
        raise r.error(f"{layers} layers is not a real model (at most {_MAX_LAYERS})",
                      "num_hidden_layers")
    if family == "llama" and (d.get("attention_bias") or d.get("mlp_bias")):
        raise InputError("llama with attention_bias/mlp_bias is not supported", path=path,
                         key="attention_bias")
    gemma = family in _GEMMAS
    if gemma:
        act = d.get("hidden_activation") or "gelu_pytorch_tanh"
    else:
        act = d.get("hidden_act", "silu")
    activations = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
                   "gelu_tanh": "gelu_tanh"}
    if not isinstance(act, str) or act not in activations:
        raise InputError(f"activation {_show(act)} is not supported; supported: "
                         f"{', '.join(activations)}", path=path,
                         key="hidden_activation" if gemma else "hidden_act")
    if family == "qwen3_moe" and d.get("attention_bias"):
        raise InputError("qwen3_moe with attention_bias is not supported", path=path,
                         key="attention_bias")
    theta, local_theta, scaling = _rope(r, family)
    types = _layer_types(r, family, layers)
    sliding = "sliding" in types
    fields = dict(
        family=family,
        vocab_size=r.get("vocab_size", int),
        hidden_size=hidden,
        intermediate_size=r.get("intermediate_size", int),
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=r.get("num_key_value_heads", int, heads),
        head_dim=r.get("head_dim", int, hidden // heads),
        max_position_embeddings=r.get("max_position_embeddings", int, 2048),
        norm_eps=r.get("rms_norm_eps", float, 1e-6),
        rope_theta=theta,
        rope_local_theta=local_theta,
        rope_scaling=scaling,
        tie_embeddings=bool(d.get("tie_word_embeddings", gemma)),
        attention_bias=family == "qwen2" or (family == "qwen2_moe"
                                              and bool(d.get("qkv_bias", True))),
        qk_norm=family in ("qwen3", "gemma3_text", "qwen3_moe"),
        activation=activations[act],
        norm_offset=1.0 if gemma else 0.0,
        embed_scale=gemma,
        post_norms=family in ("gemma2", "gemma3_text"),
        query_pre_attn_scalar=(r.get("query_pre_attn_scalar", float, None)
                               if family in ("gemma2", "gemma3_text") else None),
        attn_logit_softcap=r.get("attn_logit_softcapping", float, None),
        final_logit_softcap=r.get("final_logit_softcapping", float, None),
        sliding_window=r.get("sliding_window", int) if sliding else None,
        layer_types=types,
        moe=_moe(r, family, layers) if family in _MOES else None,
    )
    try:
        return ModelConfig(**fields)
    except InputError as e:  # a rule between fields (heads vs KV heads): add the file
        if e.path is not None:
            raise
        raise InputError(str(e).removeprefix(f"'{e.key}': "), path=path, key=e.key) from None


def _moe(r: _Reader, family: str, num_layers: int) -> MoE:
    """The routed-MLP settings (Qwen2/3-MoE key names; Mixtral's num_local_experts, its
    experts as wide as intermediate_size, every layer routed, weights always renormalised)."""
    experts = r.get("num_experts", int, None) or r.get("num_local_experts", int)
    if family == "mixtral":
        return MoE(num_experts=experts, num_experts_per_tok=r.get("num_experts_per_tok", int),
                   moe_intermediate_size=r.get("intermediate_size", int), norm_topk_prob=True)
    only = r.d.get("mlp_only_layers") or []
    if not isinstance(only, list) or any(not isinstance(i, int) or isinstance(i, bool)
                                         or not 0 <= i < num_layers for i in only):
        raise r.error(f"expected a list of layer indices below {num_layers}, got {_show(only)}",
                      "mlp_only_layers")
    norm = r.d.get("norm_topk_prob", False)
    if not isinstance(norm, bool):
        raise r.error(f"expected true or false, got {_show(norm)}", "norm_topk_prob")
    shared = r.get("shared_expert_intermediate_size", int, 0) if family == "qwen2_moe" else 0
    return MoE(num_experts=experts, num_experts_per_tok=r.get("num_experts_per_tok", int),
               moe_intermediate_size=r.get("moe_intermediate_size", int), norm_topk_prob=norm,
               shared_expert_intermediate_size=shared, mlp_only_layers=tuple(only),
               decoder_sparse_step=r.get("decoder_sparse_step", int, 1))


def _scaling_dict(s: RopeScaling | None, theta: float) -> dict:
    if s is None:
        return {"rope_type": "default", "rope_theta": theta}
    if s.kind == "linear":
        return {"rope_type": "linear", "factor": s.factor, "rope_theta": theta}
    return {"rope_type": "llama3", "factor": s.factor, "low_freq_factor": s.low_freq_factor,
            "high_freq_factor": s.high_freq_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
            "rope_theta": theta}


def config_to_hf(cfg: ModelConfig, *, bos_id: int | None = None, eos_id: int | None = None,
                 pad_id: int | None = None, dtype: str = "float32") -> dict:
    """A config.json that transformers (old and new) loads into the same computation."""
    d: dict[str, Any] = {
        "architectures": [_ARCHITECTURES[cfg.family]],
        "model_type": cfg.family,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rms_norm_eps": cfg.norm_eps,
        "tie_word_embeddings": cfg.tie_embeddings,
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "dtype": dtype, "torch_dtype": dtype,
        "rope_theta": cfg.rope_theta,
    }
    act = "silu" if cfg.activation == "silu" else "gelu_pytorch_tanh"
    d["hidden_activation" if cfg.family in _GEMMAS else "hidden_act"] = act
    d["hidden_act"] = act
    if cfg.family == "gemma3_text":
        local = cfg.rope_local_theta if cfg.rope_local_theta is not None else cfg.rope_theta
        d["rope_local_base_freq"] = local
        d["rope_parameters"] = {
            "full_attention": _scaling_dict(cfg.rope_scaling, cfg.rope_theta),
            "sliding_attention": {"rope_type": "default", "rope_theta": local}}
    else:
        d["rope_parameters"] = _scaling_dict(cfg.rope_scaling, cfg.rope_theta)
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = {k: v for k, v in _scaling_dict(cfg.rope_scaling, 0).items()
                             if k != "rope_theta"}
    if cfg.family == "llama":
        d.update(attention_bias=False, mlp_bias=False)
    if cfg.moe is not None:
        d.update(_moe_dict(cfg))
    if cfg.family in ("qwen2", "qwen3"):
        sliding = "sliding" in cfg.layer_types
        d.update(use_sliding_window=sliding, sliding_window=cfg.sliding_window,
                 max_window_layers=(cfg.layer_types.index("sliding") if sliding
                                    else cfg.num_layers))
        if cfg.family == "qwen3":
            d["attention_bias"] = False
    if cfg.family in ("gemma2", "gemma3_text"):
        scalar = cfg.query_pre_attn_scalar or cfg.head_dim
        d.update(query_pre_attn_scalar=int(scalar) if float(scalar).is_integer() else scalar,
                 attn_logit_softcapping=cfg.attn_logit_softcap,
                 final_logit_softcapping=cfg.final_logit_softcap,
                 sliding_window=cfg.sliding_window)
    if any(t == "sliding" for t in cfg.layer_types) or cfg.family in ("gemma2", "gemma3_text"):
        d["layer_types"] = ["sliding_attention" if t == "sliding" else "full_attention"
                            for t in cfg.layer_types]
    return d


def _moe_dict(cfg: ModelConfig) -> dict:
    m = cfg.moe
    if cfg.family == "mixtral":
        if m.moe_intermediate_size != cfg.intermediate_size or not m.norm_topk_prob or (
                m.shared_expert_intermediate_size or m.mlp_only_layers
                or m.decoder_sparse_step != 1):
            raise InputError("mixtral has experts of width intermediate_size in every layer, "
                             "renormalised top-k weights and no shared expert", key="moe")
        return {"num_local_experts": m.num_experts, "num_experts_per_tok": m.num_experts_per_tok,
                "sliding_window": cfg.sliding_window, "router_jitter_noise": 0.0}
    d = {"num_experts": m.num_experts, "num_local_experts": m.num_experts,
         "num_experts_per_tok": m.num_experts_per_tok,
         "moe_intermediate_size": m.moe_intermediate_size, "norm_topk_prob": m.norm_topk_prob,
         "mlp_only_layers": list(m.mlp_only_layers),
         "decoder_sparse_step": m.decoder_sparse_step, "use_sliding_window": False}
    if cfg.family == "qwen2_moe":
        if not m.shared_expert_intermediate_size:  # transformers always builds one
            raise InputError("qwen2_moe needs a shared expert (shared_expert_intermediate_size)",
                             key="moe")
        d.update(shared_expert_intermediate_size=m.shared_expert_intermediate_size,
                 qkv_bias=cfg.attention_bias)
    else:
        d["attention_bias"] = False
    return d
