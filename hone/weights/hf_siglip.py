"""What the vision-language families share in Hugging Face folders (hone/weights/hf_vision.py,
hone/weights/hf_vision_gemma3.py): the config of a SigLIP-style vision tower from a
`vision_config`, its tensor names, and the language model's names under the family's prefix.
"""

from __future__ import annotations

from hone.errors import InputError
from hone.models.vision.siglip import VisionConfig
from hone.weights.assemble import hf_name_table

_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu"}


def positive_int(d: dict, key: str, default: int, path: str, prefix: str) -> int:
    """d[key] (default if absent) as a positive integer; a square [side, side] gives side."""
    value = d.get(key, default)
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]  # a square image or patch given as [side, side]
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise InputError(f"expected a positive integer, got {value!r}", path=path,
                         key=prefix + key)
    return value


def vision_config_from_hf(d: dict, path: str, prefix: str = "vision_config.") -> VisionConfig:
    """A SigLIP-style tower's config (defaults: transformers' Idefics3VisionConfig)."""
    if not isinstance(d, dict):
        raise InputError(f"expected an object, got {d!r}", path=path, key=prefix[:-1])
    act = d.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise InputError(f"activation {act!r} is not supported; supported: "
                         f"{', '.join(_ACTIVATIONS)}", path=path, key=prefix + "hidden_act")
    eps = d.get("layer_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps > 0:
        raise InputError(f"expected a positive number, got {eps!r}", path=path,
                         key=prefix + "layer_norm_eps")
    cfg = VisionConfig(
        hidden_size=positive_int(d, "hidden_size", 1152, path, prefix),
        intermediate_size=positive_int(d, "intermediate_size", 3072, path, prefix),
        num_layers=positive_int(d, "num_hidden_layers", 12, path, prefix),
        num_heads=positive_int(d, "num_attention_heads", 16, path, prefix),
        num_channels=positive_int(d, "num_channels", 3, path, prefix),
        image_size=positive_int(d, "image_size", 224, path, prefix),
        patch_size=positive_int(d, "patch_size", 32, path, prefix),
        layer_norm_eps=float(eps),
        activation=_ACTIVATIONS[act])
    if cfg.hidden_size % cfg.num_heads:
        raise InputError(f"hidden_size {cfg.hidden_size} is not a multiple of "
                         f"num_attention_heads {cfg.num_heads}", path=path,
                         key=prefix + "num_attention_heads")
    return cfg


def text_name_table(text_cfg, prefix: str) -> dict[tuple, tuple[str, str]]:
    """The language model's rows of a family's name table: hone path ("text", ...) -> (HF name
    with "model." replaced by `prefix`, layout kind); the LM head keeps its top-level name."""
    table = {}
    for path, (name, kind) in hf_name_table(text_cfg).items():
        if name.startswith("model."):
            name = prefix + name.removeprefix("model.")
        table[("text",) + path] = (name, kind)
    return table


def tower_name_table(cfg: VisionConfig, v: str) -> dict[tuple, tuple[str, str]]:
    """A SigLIP-style tower's rows: hone path ("vision", ...) -> (HF name under prefix `v`,
    layout kind); kinds as in assemble.py, plus "conv": hone's patch kernel [C, p, p, E] <->
    HF's Conv2d weight [E, C, p, p]."""
    V = ("vision",)
    table = {
        V + ("patch", "kernel"): (v + "embeddings.patch_embedding.weight", "conv"),
        V + ("patch_bias",): (v + "embeddings.patch_embedding.bias", "same"),
        V + ("position",): (v + "embeddings.position_embedding.weight", "same"),
        V + ("post_norm", "scale"): (v + "post_layernorm.weight", "same"),
        V + ("post_norm", "bias"): (v + "post_layernorm.bias", "same")}
    for i in range(cfg.num_layers):
        p, L = f"{v}encoder.layers.{i}.", V + ("layers", i)
        for ours, theirs in (("attn_norm", "layer_norm1"), ("mlp_norm", "layer_norm2")):
            table[L + (ours, "scale")] = (p + theirs + ".weight", "same")
            table[L + (ours, "bias")] = (p + theirs + ".bias", "same")
        for x in "qkv":
            table[L + ("attn", x, "kernel")] = (p + f"self_attn.{x}_proj.weight", "in")
            table[L + ("attn", f"{x}_bias")] = (p + f"self_attn.{x}_proj.bias", "bias")
        table[L + ("attn", "o", "kernel")] = (p + "self_attn.out_proj.weight", "out")
        table[L + ("attn", "o_bias")] = (p + "self_attn.out_proj.bias", "same")
        for fc in ("fc1", "fc2"):
            table[L + ("mlp", fc, "kernel")] = (p + f"mlp.{fc}.weight", "in")
            table[L + ("mlp", f"{fc}_bias")] = (p + f"mlp.{fc}.bias", "same")
    return table
