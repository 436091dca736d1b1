"""Hugging Face checkpoint folders in (config.json + safetensors, sharded or not) and out.

Reading is memory-mapped through `safetensors.safe_open`: a tensor is touched only when the
model asks for it, and a truncated or corrupt file is reported by name before any JAX work.
The safetensors library checks every header claim (offsets, shapes times dtype sizes) against
the file size, so a header that lies fails on opening, before anything is allocated. What it
lets through is checked here: an index may only name shard files inside the folder (never
`../x` or `/dev/...`), and a tensor must have a dtype numpy can hold as model weights.
Writing goes to a temporary sibling folder that replaces the target only when complete, so a
failed export never leaves a half-written model behind.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from hone.errors import InputError
from hone.fileio import atomic_folder
from hone.models.transformer import Transformer
from hone.weights.assemble import build_model, hf_tensors
from hone.weights.hf_config import config_from_hf, config_to_hf
from hone.weights.hf_vision import VISION_FAMILIES, load_vision_hf
from hone.weights.hf_vision_save import is_vision_model, vision_hf_tensors
from hone.weights.hf_vision_save import vision_model_config_to_hf

_INDEX = "model.safetensors.index.json"
_SINGLE = "model.safetensors"
# Safetensors dtypes that become numpy arrays usable as weights. The others (F8_*, F6_*, F4,
# complex C64) have no numpy type, or no meaning as a weight, and are refused by name.
_READABLE_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U64",
                              "U32", "U16", "U8", "BOOL"})


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except OSError as e:  # a folder, no permission
        raise InputError(f"cannot read the file ({e.strerror or e})", path=str(path)) from None
    except (ValueError, RecursionError) as e:  # bad JSON or UTF-8, a 5000-digit integer, nesting
        raise InputError(f"not valid JSON ({e})", path=str(path)) from None
    if not isinstance(value, dict):
        raise InputError("expected a JSON object", path=str(path))
    return value


class SafetensorsFolder:
    """The tensors of a HF folder: `model.safetensors`, or shards listed in the index file."""

    def __init__(self, folder: Path):
        self.folder = folder
        index = folder / _INDEX
        # Where a tensor the folder lacks should have been: named in messages.
        self.default = index if index.exists() else folder / _SINGLE
        if index.exists():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise InputError("missing 'weight_map'", path=str(index), key="weight_map")
            for name, f in weight_map.items():
                if not (isinstance(f, str) and f not in ("", ".", "..") and Path(f).name == f):
                    raise InputError(f"tensor {name!r} is mapped to {f!r}; expected the name "
                                     "of a shard file in this folder", path=str(index),
                                     key="weight_map")
            self.file_of = {name: folder / f for name, f in weight_map.items()}
        elif (folder / _SINGLE).exists():
            self.file_of = None  # filled from the header below
        else:
            raise InputError(f"no {_SINGLE} or {_INDEX} found", path=str(folder))
        self.handles = {}
        files = ({folder / _SINGLE} if self.file_of is None else set(self.file_of.values()))
        for f in sorted(files):
            self.handles[f] = self._open(f)
        if self.file_of is None:
            f = folder / _SINGLE
            self.file_of = {name: f for name in self.handles[f].keys()}
        for name, f in self.file_of.items():
            if name not in self.handles[f].keys():
                raise InputError(f"index lists tensor {name!r} but the file lacks it", path=str(f))

    @staticmethod
    def _open(path: Path):
        if not path.exists():
            raise InputError("shard listed in the index is missing", path=str(path))
        try:
            return safe_open(str(path), framework="numpy")
        except (SafetensorError, OSError) as e:
            raise InputError(f"not a readable safetensors file, truncated or corrupt ({e})",
                             path=str(path)) from None

    def names(self) -> set[str]:
        return set(self.file_of)

    def where(self, name: str) -> str:
        return str(self.file_of.get(name, self.default))

    def get(self, name: str) -> np.ndarray:
        self.get_slice(name)  # checks the dtype
        try:
            return self.handles[self.file_of[name]].get_tensor(name)
        except (SafetensorError, OSError, ValueError) as e:
            raise InputError(f"tensor {name!r} cannot be read ({e})", path=self.where(name)) from None

    def get_slice(self, name: str):
        """A lazy view of one tensor: `.get_shape()`, and `[slices]` reads only that block
        (what sharded loading uses, hone/weights/sharded_load.py)."""
        try:
            view = self.handles[self.file_of[name]].get_slice(name)
            dtype = view.get_dtype()
        except (SafetensorError, OSError, ValueError) as e:
            raise InputError(f"tensor {name!r} cannot be read ({e})",
                             path=self.where(name)) from None
        if dtype not in _READABLE_DTYPES:
            raise InputError(f"tensor {name!r} has dtype {dtype}, which hone cannot read as "
                             f"weights (readable: {', '.join(sorted(_READABLE_DTYPES))})",
                             path=self.where(name))
        return view


def load_hf(folder: str | Path, dtype=jnp.float32, *, layout=None) -> Transformer:
    """A Transformer from a Hugging Face checkpoint folder. With a `layout` that has a mesh,
    each device reads only its block of each tensor (hone/weights/sharded_load.py)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise InputError("not a folder", path=str(folder))
    config = read_json(folder / "config.json")
    if config.get("model_type") in VISION_FAMILIES:  # vision-language: hone/weights/hf_vision.py
        if layout is not None and layout.mesh is not None:
            raise InputError("loading a vision-language model onto a mesh is not supported yet",
                             path=str(folder))
        return load_vision_hf(folder, config, SafetensorsFolder(folder), dtype)
    cfg = config_from_hf(config, str(folder / "config.json"))
    if layout is not None and layout.mesh is not None:
        from hone.weights.sharded_load import build_sharded
        return build_sharded(cfg, SafetensorsFolder(folder), dtype, layout)
    return build_model(cfg, SafetensorsFolder(folder), dtype)


def _shards(tensors: dict[str, np.ndarray], max_bytes: int) -> list[dict[str, np.ndarray]]:
    shards, current, size = [], {}, 0
    for name, arr in tensors.items():
        if current and size + arr.nbytes > max_bytes:
            shards.append(current)
            current, size = {}, 0
        current[name] = arr
        size += arr.nbytes
    return shards + [current]


def save_hf(model: Transformer, out_dir: str | Path, tokenizer=None, *, dtype: str | None = None,
            max_shard_bytes: int = 4 << 30) -> Path:
    """Write `model` (and the tokenizer, if given) as a folder transformers loads as-is: a
    Transformer, or a vision-language model (Idefics3) as its ForConditionalGeneration class.

    dtype: "float32", "bfloat16" or "float16" for the stored weights (default: the model's).
    The folder appears only when complete; an existing one is replaced.
    """
    out_dir = Path(out_dir)
    # A vision-language model (Idefics3): its names and nested config come from
    # hone/weights/hf_vision_save.py; the folder is written below as for a text model.
    vision = is_vision_model(model)
    tensors = (vision_hf_tensors if vision else hf_tensors)(
        model, None if dtype is None else jnp.dtype(dtype))
    stored = dtype or str(next(iter(tensors.values())).dtype)
    kw = {}
    if tokenizer is not None:
        kw = dict(bos_id=tokenizer.bos_id, eos_id=tokenizer.eos_id, pad_id=tokenizer.pad_id)
    config = (vision_model_config_to_hf if vision else config_to_hf)(model.config, dtype=stored,
                                                                      **kw)
    with atomic_folder(out_dir) as tmp:
        shards = _shards(tensors, max_shard_bytes)
        if len(shards) == 1:
            save_file(shards[0], str(tmp / _SINGLE), metadata={"format": "pt"})
        else:
            weight_map = {}
            for i, shard in enumerate(shards):
                fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
                save_file(shard, str(tmp / fname), metadata={"format": "pt"})
                weight_map.update({name: fname for name in shard})
            total = sum(a.nbytes for a in tensors.values())
            (tmp / _INDEX).write_text(json.dumps(
                {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
        if tokenizer is not None and len(getattr(tokenizer, "eos_ids", ())) > 1:
            gen["eos_token_id"] = list(tokenizer.eos_ids)
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        if tokenizer is not None:
            tokenizer.save(tmp)
    return out_dir
