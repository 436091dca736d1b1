"""Hugging Face folders of Gemma 3 vision-language models in
(`Gemma3ForConditionalGeneration`, model_type gemma3); hone/weights/hf_vision.py dispatches here.

Tensor names come in three layouts, all read: the Hub's and transformers 5's save_pretrained
(`language_model.model.*`, `language_model.lm_head.weight`, `multi_modal_projector.*`, and
`vision_tower.vision_model.*` on the Hub, `vision_tower.*` from transformers 5), and transformers
5's module names (`model.language_model.*`, `model.vision_tower.*`, `lm_head.weight`), which is
what the table here is written in. The text model's tensors are the text families' (assemble.py's
table) under `model.language_model.`; the SigLIP pooling head (`vision_tower.head.*`) is
unused (Gemma 3 reads the last hidden state) and ignored. Config keys missing from a Hub
config.json take transformers' defaults (Gemma3TextConfig's, SiglipVisionConfig's), and tying
follows the top-level `tie_word_embeddings` (default true), as transformers 5 does.
"""

from __future__ import annotations

import math
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.vision.gemma3 import Gemma3Vision, Gemma3VisionConfig
from hone.weights.assemble import TensorSource, hf_shape, missing_names
from hone.weights.assemble import stored_name, to_hone
from hone.weights.hf_config import config_from_hf
from hone.weights.hf_siglip import text_name_table, tower_name_table, vision_config_from_hf

# transformers' Gemma3TextConfig defaults for the keys a Hub text_config may leave out.
_TEXT_DEFAULTS = {"model_type": "gemma3_text", "vocab_size": 262_208, "hidden_size": 2304,
                  "intermediate_size": 9216, "num_hidden_layers": 26, "num_attention_heads": 8,
                  "num_key_value_heads": 4, "head_dim": 256, "rms_norm_eps": 1e-6,
                  "max_position_embeddings": 131_072, "query_pre_attn_scalar": 256,
                  "sliding_window": 4096}
# SiglipVisionConfig's defaults (vision_config_from_hf's are Idefics3's).
_VISION_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12,
                    "num_attention_heads": 12, "image_size": 224, "patch_size": 16}
# Stored prefix -> the table's, first match wins (a table name maps to itself).
_PREFIXES = (("language_model.model.", "model.language_model."),
             ("language_model.lm_head.", "lm_head."),
             ("model.vision_tower.vision_model.", "model.vision_tower."),
             ("vision_tower.vision_model.", "model.vision_tower."),
             ("vision_tower.", "model.vision_tower."),
             ("multi_modal_projector.", "model.multi_modal_projector."))


def _count(d: dict, key: str, default: int, path: str) -> int:
    value = d.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"expected a non-negative integer, got {value!r}", path=path, key=key)
    return value


def gemma3_config_from_hf(d: dict, path: str = "config.json") -> Gemma3VisionConfig:
    """A Gemma3VisionConfig from a parsed config.json of model_type gemma3."""
    text = d.get("text_config") or {}
    if not isinstance(text, dict):
        raise InputError(f"expected an object, got {text!r}", path=path, key="text_config")
    text = {**_TEXT_DEFAULTS, **text, "tie_word_embeddings": bool(d.get("tie_word_embeddings",
                                                                        True))}
    if text["model_type"] != "gemma3_text":
        raise InputError(f"text model {text['model_type']!r} is not supported for gemma3; "
                         "supported: gemma3_text", path=path, key="text_config.model_type")
    if text.get("use_bidirectional_attention"):
        raise InputError("use_bidirectional_attention (an encoder-style Gemma 3) is not "
                         "supported", path=path, key="text_config.use_bidirectional_attention")
    vision = d.get("vision_config") or {}
    if not isinstance(vision, dict):
        raise InputError(f"expected an object, got {vision!r}", path=path, key="vision_config")
    vision = vision_config_from_hf({**_VISION_DEFAULTS, **vision}, path)
    tokens = _count(d, "mm_tokens_per_image", 256, path)
    side, grid = math.isqrt(tokens), vision.patches_per_side
    if tokens == 0 or side * side != tokens or grid % side:
        raise InputError(f"must be a square whose side divides the {grid} x {grid} patch grid "
                         f"(image_size // patch_size), got {tokens}", path=path,
                         key="mm_tokens_per_image")
    key = "image_token_index" if "image_token_index" in d else "image_token_id"
    return Gemma3VisionConfig(vision=vision, text=config_from_hf(text, path),
                              mm_tokens_per_image=tokens,
                              image_token_id=_count(d, key, 262_144, path))


def gemma3_name_table(cfg: Gemma3VisionConfig) -> dict[tuple, tuple[str, str]]:
    """hone parameter path -> (HF tensor name in transformers 5's module names, layout kind);
    kinds as in assemble.py, plus "conv" (the patch kernel, as in hf_vision.py)."""
    table = {**text_name_table(cfg.text, "model.language_model."),
             **tower_name_table(cfg.vision, "model.vision_tower.")}
    m = "model.multi_modal_projector."
    table[("projector", "norm", "scale")] = (m + "mm_soft_emb_norm.weight", "same")
    table[("projector", "proj", "kernel")] = (m + "mm_input_projection_weight", "same")  # [E, D]
    return table


class _Renamed:
    """A TensorSource seen under the table's names (see the module docstring's layouts)."""

    def __init__(self, source: TensorSource):
        self.source = source
        self.stored: dict[str, str] = {}
        for name in source.names():
            ours = next((new + name.removeprefix(old) for old, new in _PREFIXES
                         if name.startswith(old)), name)
            self.stored.setdefault(ours, name)

    def names(self) -> set[str]:
        return set(self.stored)

    def get(self, name: str) -> np.ndarray:
        return self.source.get(self.stored[name])

    def where(self, name: str) -> str:
        return self.source.where(self.stored.get(name, name))


def build_gemma3(cfg: Gemma3VisionConfig, source: TensorSource,
                 dtype=jnp.float32) -> Gemma3Vision:
    """A Gemma3Vision whose parameters are the source's tensors (cast to dtype), every name and
    shape checked before anything is converted."""
    source = _Renamed(source)
    table = gemma3_name_table(cfg)
    available = source.names()
    missing = sorted(n for name, kind in table.values()
                     for n in missing_names(name, kind, available, 0))
    if missing:
        raise InputError(f"tensor {missing[0]!r} is missing ({len(missing)} missing in all)",
                         path=source.where(missing[0]))
    abstract = nnx.eval_shape(lambda: Gemma3Vision(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    leaves = []
    for path, var in nnx.to_flat_state(state):
        name, kind = table[path]
        name = stored_name(name, available)
        arr = source.get(name)
        conv = kind == "conv"  # hone's [C, p, p, E] <-> HF's Conv2d weight [E, C, p, p]
        want = (var.shape[-1],) + tuple(var.shape[:-1]) if conv else hf_shape(var.shape, kind)
        if tuple(arr.shape) != want:
            raise InputError(f"tensor {source.stored[name]!r} has shape {tuple(arr.shape)}, "
                             f"expected {want} from the config", path=source.where(name))
        value = np.transpose(arr, (1, 2, 3, 0)) if conv else to_hone(arr, var.shape, kind)
        leaves.append((path, var.replace(jnp.asarray(value, dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def load_gemma3_hf(folder: Path, config: dict, source: TensorSource, dtype=jnp.float32):
    """The Gemma3Vision of a HF folder whose config.json (parsed: `config`) is model_type
    gemma3."""
    return build_gemma3(gemma3_config_from_hf(config, str(folder / "config.json")), source,
                        dtype)
