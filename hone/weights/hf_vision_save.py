"""Vision-language models out as Hugging Face folders: Idefics3 / SmolVLM
(`Idefics3ForConditionalGeneration`), the inverse of hone/weights/hf_vision.py.

`hone.save_hf` writes a vision-language model through here: the tensors under transformers'
names (hf_vision.py's table read backwards, so loading and saving cannot disagree on a name)
and a config.json in transformers' nested form (vision_config, text_config, scale_factor,
image_token_id). Tying is stated at the top level and in text_config alike: transformers 5
reads the top level, older versions the text config. The folder's writing (shards, the
temporary sibling, generation_config.json, the tokenizer) is save_hf's, shared with text models.
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.transformer import Transformer
from hone.models.vision.idefics3 import Idefics3, Idefics3Config
from hone.models.vision.siglip import VisionConfig
from hone.weights.assemble import to_hf
from hone.weights.hf_config import config_to_hf
from hone.weights.hf_vision import idefics3_name_table

# hone's activation names -> transformers' (hf_siglip._ACTIVATIONS read backwards).
_ACTIVATIONS = {"gelu_tanh": "gelu_pytorch_tanh", "gelu": "gelu"}


def is_vision_model(model) -> bool:
    """Whether save_hf writes `model` through this file: a vision-language model, which holds
    its language model as `text` (a family without an export here is refused by name)."""
    return isinstance(getattr(model, "text", None), Transformer)


def vision_name_table(model) -> dict[tuple, tuple[str, str]]:
    """hone parameter path -> (HF tensor name, layout kind) of a vision-language model."""
    if isinstance(model, Idefics3):
        return idefics3_name_table(model.config)
    raise InputError(f"no Hugging Face export for {type(model).__name__}", key="model")


def vision_config_to_hf(cfg: VisionConfig, model_type: str) -> dict:
    """A SigLIP-style tower's vision_config."""
    return {
        "model_type": model_type,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_channels": cfg.num_channels,
        "image_size": cfg.image_size,
        "patch_size": cfg.patch_size,
        "layer_norm_eps": cfg.layer_norm_eps,
        "hidden_act": _ACTIVATIONS[cfg.activation],
    }


def idefics3_config_to_hf(cfg: Idefics3Config, *, bos_id: int | None = None,
                          eos_id: int | None = None, pad_id: int | None = None,
                          dtype: str = "float32") -> dict:
    """The config.json transformers reads into an Idefics3ForConditionalGeneration computing
    what `cfg` does."""
    text = config_to_hf(cfg.text, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, dtype=dtype)
    text.pop("architectures")
    return {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": cfg.image_token_id,
        "scale_factor": cfg.scale_factor,
        "tie_word_embeddings": cfg.text.tie_embeddings,
        # Top level as well as in text_config: save_hf's generation_config.json reads them here.
        "bos_token_id": bos_id, "eos_token_id": eos_id, "pad_token_id": pad_id,
        "dtype": dtype, "torch_dtype": dtype,
        "text_config": text,
        "vision_config": vision_config_to_hf(cfg.vision, "idefics3_vision"),
    }


def vision_model_config_to_hf(cfg, **kw) -> dict:
    """config.json of a vision-language model's config (save_hf's counterpart of config_to_hf)."""
    if isinstance(cfg, Idefics3Config):
        return idefics3_config_to_hf(cfg, **kw)
    raise InputError(f"no Hugging Face export for {type(cfg).__name__}", key="model")


def vision_hf_tensors(model, dtype=None) -> dict[str, np.ndarray]:
    """The model's parameters as HF-named numpy arrays (optionally cast). Adapters must be
    merged first (hone.models.lora.merge_lora): a folder holds plain weights only."""
    table = vision_name_table(model)
    out = {}
    for path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if path not in table:
            where = "/".join(map(str, path))
            raise InputError(f"parameter {where} has no Hugging Face name (LoRA adapters? merge "
                             f"them first with merge_lora, or export them with save_peft)",
                             key="model")
        name, kind = table[path]
        arr = np.asarray(jax.device_get(var[...]))
        if dtype is not None:
            arr = arr.astype(dtype)
        if kind == "conv":  # hone's patch kernel [C, p, p, E] -> Conv2d's weight [E, C, p, p]
            out[name] = np.ascontiguousarray(np.transpose(arr, (3, 0, 1, 2)))
        else:
            out[name] = to_hf(arr, kind)
    return out
