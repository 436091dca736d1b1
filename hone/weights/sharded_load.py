"""Building a Transformer whose parameters are created directly on their mesh shardings.

`load_model(..., layout=...)` comes here when the layout has a mesh. The point is that no
device ever holds a whole weight it is not meant to keep (the unsharded path materialises every
weight on the default device and `Layout.place_model` moves it afterwards, so device 0 briefly
holds the whole model). Three cases, by what the format allows:

- Safetensors (any source with `get_slice`): every parameter is made with
  `jax.make_array_from_callback(shape, sharding, cb)`; `cb(index)` is called once per local
  device with that device's block in hone's layout and reads only the HF block it needs through
  `safe_open(...).get_slice(name)[...]`. The HF <-> hone layouts of `weights.py` are
  transposes plus a reshape that flattens a group of hone axes into one HF axis ("in": hone
  [in, *out] <- HF [prod(out), in]; "out": hone [*in, out] <- HF [out, prod(in)]; "bias": hone
  [N, H] <- HF [N*H]). A block of a flattened group is one contiguous HF range exactly when the
  axes after the group's first are whole; then the read is exact. Otherwise the read covers
  whole rows of the group's first axis and the block is cut out on the host. With the rules
  table in hone/parallel (head_dim is never split) the reads are always exact for hone's models.
- Whole host tensors (a GGUF file, dequantized on the host by `read_gguf`): each tensor is
  placed with the same callback, tensor by tensor, so each device receives only its shard, and
  the loader drops its host reference once placed. (The CPU backend may alias a block that is
  a plain view of the host tensor instead of copying it, which keeps that tensor alive as long
  as the model; accelerators copy.)
- Random init (presets): the Transformer constructor runs under `jax.jit` with `out_shardings`,
  so XLA partitions the random-number generation and each device computes only its shard.
  With JAX's partitionable threefry (the default) the values equal the unsharded init.

Values are cast to the model dtype with numpy (ml_dtypes for bfloat16), which rounds to
nearest-even like the unsharded path's `jnp.asarray(x, dtype)`.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import numpy as np
from flax import nnx
from safetensors import SafetensorError

from hone.errors import InputError
from hone.models.config import ModelConfig
from hone.models.transformer import Transformer
from hone.weights.assemble import (DictSource, hf_name_table, hf_shape, missing_names,
                                 read_experts, stored_name)

Index = tuple[slice, ...]  # one step-1 slice per axis, bounds resolved


class HostTensors(DictSource):
    """Whole tensors already on the host (a converted GGUF), each handed over once: `take`
    drops this dict's reference, so a tensor's host copy can be freed once it is placed."""

    def take(self, name: str) -> np.ndarray:
        return self.tensors.pop(name)


# ---- hone block -> HF block --------------------------------------------------------------------


def _resolve(index: tuple, shape: tuple[int, ...]) -> Index:
    """make_array_from_callback's index (slices with None bounds) as explicit bounds."""
    out = []
    for s, n in zip(index, shape):
        start, stop, step = s.indices(n)
        assert step == 1, index
        out.append(slice(start, stop))
    return tuple(out)


def _flat_range(block: Index, dims: tuple[int, ...]) -> tuple[slice, tuple[int, ...], Index]:
    """For the axes `dims` that HF flattens (row-major) into one axis, and a block of them:
    the contiguous HF range to read, the shape to view it as, and the cut that leaves the block.

    The range spans whole rows of the first axis of the group, so it is exact when the other
    axes of the block are whole, and a superset (cut on the host) otherwise.
    """
    rest = math.prod(dims[1:])
    first = block[0]
    rows = slice(first.start * rest, first.stop * rest)
    shape = (first.stop - first.start,) + tuple(dims[1:])
    cut = (slice(None),) + tuple(block[1:])
    return rows, shape, cut


def hf_block(read: Callable[[Index], np.ndarray], index: Index, shape: tuple[int, ...],
             kind: str) -> np.ndarray:
    """The block `index` of a hone parameter of `shape`, from `read(hf_index)` of its HF tensor
    stored with layout `kind` (see hone/weights/assemble.py)."""
    if kind == "same":
        return read(index)
    if kind == "bias":  # hone [N, H] <- HF [N*H]
        rows, view, cut = _flat_range(index, shape)
        return read((rows,)).reshape(view)[cut]
    if kind == "in":  # hone [in, *out] <- HF [prod(out), in]
        rows, view, cut = _flat_range(index[1:], shape[1:])
        block = read((rows, index[0]))  # [rows, in block]
        return block.T.reshape((block.shape[1],) + view)[(slice(None),) + cut]
    if kind == "out":  # hone [*in, out] <- HF [out, prod(in)]
        cols, view, cut = _flat_range(index[:-1], shape[:-1])
        block = read((index[-1], cols))  # [out block, cols]
        return block.T.reshape(view + (block.shape[0],))[cut + (slice(None),)]
    raise ValueError(f"unknown layout kind {kind!r}")


# ---- reading one HF tensor ---------------------------------------------------------------------


class _Tensor:
    """One HF tensor of a source: its shape without reading it, and blocks of it."""

    def __init__(self, source, name: str):
        self.source, self.name = source, name
        self.sliced = source.get_slice(name) if hasattr(source, "get_slice") else None
        self.whole = None

    @property
    def shape(self) -> tuple[int, ...]:
        if self.sliced is not None:
            return tuple(self.sliced.get_shape())
        return tuple(self.source.get(self.name).shape)

    def read(self, index: Index) -> np.ndarray:
        if self.sliced is None:
            if self.whole is None:
                take = getattr(self.source, "take", self.source.get)
                self.whole = take(self.name)
            return self.whole[index]
        try:
            return self.sliced[index]
        except (SafetensorError, OSError, ValueError) as e:
            raise InputError(f"tensor {self.name!r} cannot be read ({e})",
                             path=self.source.where(self.name)) from None


def _make_array(shape: tuple[int, ...], dtype, sharding,
                block: Callable[[Index], np.ndarray]) -> jax.Array:
    """A global array of `shape` whose every local device gets `block(its index)` cast to
    dtype; no device sees more than its own block."""
    np_dtype = np.dtype(dtype)

    def callback(index):
        x = block(_resolve(index, shape))
        return np.ascontiguousarray(x.astype(np_dtype, copy=False))

    return jax.make_array_from_callback(shape, sharding, callback)


def _abstract(cfg: ModelConfig, dtype, seed: int = 0):
    abstract = nnx.eval_shape(lambda: Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(seed)))
    graphdef, state = nnx.split(abstract)
    return graphdef, nnx.to_flat_state(state)


def _sharding(layout, var):
    return layout.param(var.get_metadata().get("out_sharding"), tuple(var.shape))


# ---- the two builders --------------------------------------------------------------------------


def build_sharded(cfg: ModelConfig, source, dtype, layout) -> Transformer:
    """A Transformer whose parameters are the source's HF tensors, each created on its sharding
    of `layout` (see module docstring). Checks names and shapes of all tensors first, like
    `weights.build_model`, before any tensor is read."""
    graphdef, flat = _abstract(cfg, dtype)
    table = hf_name_table(cfg)
    available = source.names()
    experts = cfg.moe.num_experts if cfg.moe is not None else 0
    missing = [n for path, _ in flat for n in missing_names(*table[path], available, experts)]
    if missing:
        raise InputError(f"tensor {missing[0]!r} is missing ({len(missing)} missing in all)",
                         path=source.where(missing[0]))
    tensors = {}
    for path, var in flat:
        name, kind = table[path]
        if kind == "experts":  # read per block of experts below (read_experts checks shapes)
            continue
        name = stored_name(name, available)
        tensor = tensors[path] = _Tensor(source, name)
        want = hf_shape(var.shape, kind)
        if tensor.shape != want:
            raise InputError(f"tensor {name!r} has shape {tensor.shape}, expected {want} from "
                             f"the config", path=source.where(name))
    leaves = []
    for path, var in flat:
        name, kind = table[path]
        shape = tuple(var.shape)
        if kind == "experts":  # a device's block: the experts of its block, then cut
            value = _make_array(shape, dtype, _sharding(layout, var), lambda index: read_experts(
                source, name, shape, range(index[0].start, index[0].stop))[
                    (slice(None),) + index[1:]])
            leaves.append((path, var.replace(value)))
            continue
        tensor = tensors.pop(path)
        # The callback runs inside _make_array, once per local device, before the loop moves on.
        value = _make_array(shape, dtype, _sharding(layout, var),
                            lambda index: hf_block(tensor.read, index, shape, kind))
        leaves.append((path, var.replace(value)))
        tensor.whole = None  # the loader's last reference to a whole (GGUF) tensor
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))


def init_sharded(cfg: ModelConfig, dtype, seed: int, layout) -> Transformer:
    """`Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(seed))` with every variable created on its
    sharding of `layout` by one jitted init (each device computes only its shard)."""
    graphdef, flat = _abstract(cfg, dtype, seed)

    def init():
        model = Transformer(cfg, dtype=dtype, rngs=nnx.Rngs(seed))
        return [var[...] for _, var in nnx.to_flat_state(nnx.state(model))]

    values = jax.jit(init, out_shardings=[_sharding(layout, var) for _, var in flat])()
    leaves = [(path, var.replace(v)) for (path, var), v in zip(flat, values)]
    return nnx.merge(graphdef, nnx.from_flat_state(leaves))
