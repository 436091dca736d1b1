"""Trainable parameters stored stacked over the scanned blocks (train.scan_layers), so that the
train step and the optimizer see one [G, ...] array per kind of block weight, not one per block.

Why: with per-block parameters the scan had to stack every weight inside the step and slice
its gradient back into each block's leaf, and AdamW updated every block's leaves on their own,
so the compiled step still grew with depth (1.2 CPU s of compile per layer, 3x the loop's). In
this layout the step scans the stored stacks directly: no stack, no gradient slice, and one
AdamW update per kind of weight whatever the depth.

The layout, in the flat {key: array} dicts of the train state (hone.train.state):
- a block weight "{prefix}layers/{i}/{rest}" of a Transformer at `prefix` ("" for a plain
  model, "policy/", "backbone/" ... for one inside another module) whose blocks scan in groups
  of `p` (hone.models.scan_layers.period), G groups, is stored at
  "{prefix}layers/~{j}of{p}/{rest}" with j = i mod p and leading dimension G (group g holds
  block g * p + j);
- blocks past the last whole group, and any weight not trainable in every group (top-layer
  training), keep their per-block keys; so does everything outside the blocks.
The keys describe themselves (prefix, position j, period p, and G as the leading dimension),
so every function here but `stack_flat` needs no plan. Optimizer states and any other dict keyed like
the parameters (an EMA copy) follow the same layout: `map_param_dicts` rewrites them all.

Checkpoints always hold the per-block layout (`Relayout` converts on save and restore), so
exports, `hone export` of a checkpoint and resuming with train.scan_layers switched work as
before. The price: a save copies the state into that layout first (on the device, one more
copy of the parameters and optimizer state while the save's device-to-host copy runs).
Building a model from stacked parameters (`hone.train.state.unflatten`) slices the
stacks into the blocks; the train step's `merge` also hands the stacks to the Transformer
(`provide`), whose scan then reads them instead of those slices, which go unused.
"""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec

from hone.models.scan_layers import give, period, scannable

_PER_BLOCK = re.compile(r"^(.*?)layers/(\d+)/(.+)$")
_STACKED = re.compile(r"^(.*?)layers/~(\d+)of(\d+)/(.+)$")

Plan = dict[str, tuple[int, int]]  # Transformer prefix -> (period p, whole groups G)


def stacked_key(prefix: str, j: int, p: int, rest: str) -> str:
    return f"{prefix}layers/~{j}of{p}/{rest}"


def is_stacked(flat: dict) -> bool:
    return any(isinstance(k, str) and _STACKED.match(k) for k in flat)


def plan_of(model: nnx.Module) -> Plan:
    """{prefix: (p, G)} for every Transformer in `model` whose blocks run as a scan
    (scan_layers set, no random streams, at least two whole groups)."""
    from hone.models.transformer import Transformer
    plan = {}
    for path, module in nnx.iter_modules(model):
        if isinstance(module, Transformer) and module.scan_layers and scannable(module.layers):
            p = period([nnx.graphdef(b) for b in module.layers])
            if p:
                plan["".join(f"{part}/" for part in path)] = (p, len(module.layers) // p)
    return plan


def stack_flat(flat: dict[str, Any], plan: Plan) -> dict[str, Any]:
    """Per-block keys -> the stacked layout of `plan` (see the module docstring)."""
    out, groups = {}, {}
    for key, value in flat.items():
        m = _PER_BLOCK.match(key)
        if m and m[1] in plan:
            p, g = plan[m[1]]
            i = int(m[2])
            if i < p * g:
                groups.setdefault((m[1], i % p, m[3]), {})[i // p] = value
                continue
        out[key] = value
    for (prefix, j, rest), by_group in groups.items():
        p, g = plan[prefix]
        if len(by_group) == g:
            out[stacked_key(prefix, j, p, rest)] = jnp.stack([by_group[n] for n in range(g)])
        else:  # not trainable in every group: stays per block
            out.update({f"{prefix}layers/{n * p + j}/{rest}": v for n, v in by_group.items()})
    return out


def _per_block_keys(key: str, groups: int):
    """The per-block keys of stacked `key`'s groups, in group order (None: not stacked)."""
    m = _STACKED.match(key)
    if not m:
        return None
    prefix, j, p, rest = m[1], int(m[2]), int(m[3]), m[4]
    return [f"{prefix}layers/{g * p + j}/{rest}" for g in range(groups)]


def unstack_flat(flat: dict[str, Any]) -> dict[str, Any]:
    """The stacked layout -> per-block keys (slices; inside jit they fuse or go unused)."""
    if not is_stacked(flat):
        return flat
    out = {}
    for key, value in flat.items():
        keys = _per_block_keys(key, value.shape[0])
        if keys is None:
            out[key] = value
        else:
            out.update({k: value[g] for g, k in enumerate(keys)})
    return out


def restack_flat(flat: dict[str, Any], like: dict[str, Any]) -> dict[str, Any]:
    """Per-block keys -> the layout of `like` (a dict of the run's layout: arrays or shapes)."""
    out = {}
    for key, value in like.items():
        keys = _per_block_keys(key, value.shape[0]) if len(value.shape) else None
        missing = [k for k in (keys or [key]) if k not in flat]
        if missing:
            raise ValueError(f"the saved parameters lack {missing[0]!r}, which the run's "
                             f"layout needs for {key!r}")
        out[key] = flat[key] if keys is None else jnp.stack([flat[k] for k in keys])
    return out


def stacked_names(names: dict[str, Any], flat: dict[str, Any]) -> dict[str, Any]:
    """Logical names (hone.parallel.layout.logical_names, per block) extended to the stacked
    keys of `flat`: a stack's leading group axis is unnamed, so never split."""
    out = dict(names)
    for key, value in flat.items():
        keys = _per_block_keys(key, value.shape[0]) if len(value.shape) else None
        if keys is not None:
            inner = names.get(keys[0])
            out[key] = None if inner is None else (None, *inner)
    return out


def _is_param_dict(x) -> bool:
    return isinstance(x, dict) and any(
        isinstance(k, str) and (_PER_BLOCK.match(k) or _STACKED.match(k)) for k in x)


def map_param_dicts(tree, fn):
    """`tree` with every dict keyed like the parameters (params, the optimizer's moments, an
    EMA copy) replaced by fn(dict)."""
    return jax.tree.map(lambda x: fn(x) if _is_param_dict(x) else x, tree,
                        is_leaf=_is_param_dict)


def provide(model: nnx.Module, flat: dict[str, Any]) -> None:
    """Hand the stacked blocks' weights in `flat` to the Transformers of `model` that they
    belong to, for their scan (hone.models.scan_layers.give)."""
    by_prefix: dict[str, dict[int, dict[str, Any]]] = {}
    for key, value in flat.items():
        m = _STACKED.match(key)
        if m:
            by_prefix.setdefault(m[1], {}).setdefault(int(m[2]), {})[m[4]] = value
    for prefix, given in by_prefix.items():
        node = model
        for part in prefix.split("/")[:-1]:
            node = node[int(part)] if part.isdigit() else getattr(node, part)
        give(node, given)


def _unstacked_sharding(sharding):
    if isinstance(sharding, NamedSharding):
        return NamedSharding(sharding.mesh, PartitionSpec(*tuple(sharding.spec)[1:]))
    return sharding


def _per_block_like(d: dict) -> dict:
    out = {}
    for key, value in d.items():
        keys = _per_block_keys(key, value.shape[0]) if len(value.shape) else None
        if keys is None:
            out[key] = value
            continue
        sharding = _unstacked_sharding(value.sharding)
        out.update({k: jax.ShapeDtypeStruct(value.shape[1:], value.dtype, sharding=sharding)
                    for k in keys})
    return out


def _shardings(abstract):
    return jax.tree.map(lambda x: x.sharding, abstract)


class Relayout:
    """Converts a train state in the stacked layout to the per-block one checkpoints keep,
    and back, as two jitted programs (compiled once per run) placed as the state is."""

    def __init__(self, like):
        self.like = like  # the run's state, abstract (ShapeDtypeStruct with shardings)
        self.saved_like = map_param_dicts(like, _per_block_like)
        self._save = jax.jit(lambda t: map_param_dicts(t, unstack_flat),
                             out_shardings=_shardings(self.saved_like))
        likes = []
        map_param_dicts(like, lambda d: likes.append(d) or d)

        def load(tree):
            it = iter(likes)  # the same dicts in the same order: the trees share a structure
            return map_param_dicts(tree, lambda d: restack_flat(d, next(it)))

        self._load = jax.jit(load, out_shardings=_shardings(like))

    @staticmethod
    def of(state) -> "Relayout | None":
        """A Relayout when `state` has stacked parameters, else None."""
        if not is_stacked(state.get("params", {})):
            return None
        return Relayout(jax.tree.map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state))

    def to_saved(self, state):
        """The run's state -> the per-block layout (a copy; the state is not donated)."""
        return self._save(state)

    def from_saved(self, state):
        """A restored per-block state -> the run's layout, placed like the run's state."""
        return self._load(state)
