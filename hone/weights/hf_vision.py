"""Hugging Face folders of vision-language models in: Idefics3 / SmolVLM
(`Idefics3ForConditionalGeneration`, model_type idefics3); Gemma 3 (model_type gemma3) is
hone/weights/hf_vision_gemma3.py's, dispatched from `load_vision_hf`, and the SigLIP tower's
config hone/weights/hf_siglip.py's.

The text model's tensors are the text families' (hone/weights/assemble.py's table) under
`model.text_model.` instead of `model.`, with `lm_head.weight` at the top; the vision tower's
and the connector's are named here. As for text models, the model is built abstractly first
and every tensor is checked against the shape the config implies before any is converted.
Tying follows transformers 5: the top-level `tie_word_embeddings` decides (not text_config's).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.vision.gemma3 import Gemma3Vision
from hone.models.vision.idefics3 import Idefics3, Idefics3Config
from hone.weights.assemble import TensorSource, hf_shape, missing_names
from hone.weights.assemble import stored_name, to_hone
from hone.weights.hf_config import config_from_hf
from hone.weights.hf_siglip import (positive_int, text_name_table, tower_name_table,
                                    vision_config_from_hf)
from hone.weights.hf_vision_gemma3 import gemma3_config_from_hf, load_gemma3_hf

VISION_FAMILIES = ("idefics3", "gemma3")


def idefics3_config_from_hf(d: dict, path: str = "config.json") -> Idefics3Config:
    """An Idefics3Config from a parsed config.json of model_type idefics3."""
    text = d.get("text_config")
    if not isinstance(text, dict):
        raise InputError("missing the 'text_config' object", path=path, key="text_config")
    # transformers' Idefics3Config fills a missing text model type and epsilon this way.
    text = {"model_type": "llama", "rms_norm_eps": 1e-5, **text,
            "tie_word_embeddings": bool(d.get("tie_word_embeddings", False))}
    if text["model_type"] != "llama":
        raise InputError(f"text model {text['model_type']!r} is not supported for idefics3; "
                         "supported: llama", path=path, key="text_config.model_type")
    vision = vision_config_from_hf(d.get("vision_config") or {}, path)
    scale = positive_int(d, "scale_factor", 2, path, "")
    side = vision.patches_per_side
    if side % scale:
        raise InputError(f"the vision grid side {side} (image_size // patch_size) is not a "
                         f"multiple of scale_factor {scale}", path=path, key="scale_factor")
    token = d.get("image_token_id", 128257)
    if not isinstance(token, int) or isinstance(token, bool) or token < 0:
        raise InputError(f"expected a token id, got {token!r}", path=path, key="image_token_id")
    return Idefics3Config(vision=vision, text=config_from_hf(text, path), scale_factor=scale,
                          image_token_id=token)


def idefics3_name_table(cfg: Idefics3Config) -> dict[tuple, tuple[str, str]]:
    """hone parameter path -> (HF tensor name, layout kind); kinds as in assemble.py, plus
    "conv": hone's patch kernel [C, p, p, E] <-> HF's Conv2d weight [E, C, p, p]."""
    table = {**text_name_table(cfg.text, "model.text_model."),
             **tower_name_table(cfg.vision, "model.vision_model.")}
    table[("connector", "proj", "kernel")] = ("model.connector.modality_projection.proj.weight",
                                              "in")
    return table


def _hf_shape(shape: tuple[int, ...], kind: str) -> tuple[int, ...]:
    return (shape[-1],) + tuple(shape[:-1]) if kind == "conv" else hf_shape(shape, kind)


def _to_hone(x: np.ndarray, shape: tuple[int, ...], kind: str) -> np.ndarray:
    return np.transpose(x, (1, 2, 3, 0)) if kind == "conv" else to_hone(x, shape, kind)


def build_idefics3(cfg: Idefics3Config, source: TensorSource, dtype=jnp.float32) -> Idefics3:
    """An Idefics3 whose parameters are the source's tensors (cast to dtype), every name and
    shape checked before anything is converted."""
    table = idefics3_name_table(cfg)
    available = source.names()
    missing = sorted(n for name, kind in table.values()
                     for n in missing_names(name, kind, available, 0))
    if missing:
        raise InputError(f"tensor {missing[0]!r} is missing ({len(missing)} missing in all)",
                         path=source.where(missing[0]))
    abstract = nnx.eval_shape(lambda: Idefics3(cfg, dtype=dtype, rngs=nnx.Rngs(0)))
    graphdef, state = nnx.split(abstract)
    leaves = []
    for path, var in nnx.to_flat_state(state):
        name, kind = table[path]
        name = stored_name(name, available)
        arr = source.get(name)
        want = _hf_shape(var.shape, kind)
        if tuple(arr.shape) != want:
            raise InputError(f"tensor {name!r} has shape {tuple(arr.shape)}, expected {want} "
                             f"from the config", path=source.where(name))
        leaves.append((path, var.replace(jnp.asarray(_to_hone(arr, var.shape, kind), dtype))))
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def load_vision_hf(folder: Path, config: dict, source: TensorSource, dtype=jnp.float32):
    """The vision-language model of a HF folder whose config.json (parsed: `config`) names a
    family of VISION_FAMILIES."""
    if config.get("model_type") == "gemma3":
        return load_gemma3_hf(folder, config, source, dtype)
    cfg = idefics3_config_from_hf(config, str(folder / "config.json"))
    return build_idefics3(cfg, source, dtype)


def vision_family(source) -> str | None:
    """The model_type of a Hugging Face folder holding a vision-language model (one of
    VISION_FAMILIES), else None (a text model, a preset, a GGUF file)."""
    config = Path(str(source)) / "config.json"
    if not config.is_file():
        return None
    try:
        family = json.loads(config.read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return family if family in VISION_FAMILIES else None


def vision_model_config(folder) -> Callable[[], object]:
    """A function building the (random-init) vision-language model of a HF folder's
    config.json: what nnx.eval_shape takes to know its parameters without reading weights."""
    path = Path(str(folder)) / "config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    if config.get("model_type") == "gemma3":
        cfg = gemma3_config_from_hf(config, str(path))
        return lambda: Gemma3Vision(cfg, rngs=nnx.Rngs(0))
    cfg = idefics3_config_from_hf(config, str(path))
    return lambda: Idefics3(cfg, rngs=nnx.Rngs(0))
