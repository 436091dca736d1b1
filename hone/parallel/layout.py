"""Where every array of a run lives on the mesh.

- Parameters (trainable and frozen, and any copy such as a DPO reference): by their logical
  axis names through the rules table (`hone/parallel/rules.py`).
- Optimizer state: each leaf that mirrors a parameter (Adam's moments are dicts keyed like the
  parameters) is sharded like that parameter; scalars (the step count) are replicated. So the
  optimizer bytes per device fall with fsdp exactly as the parameter bytes do.
- Batch rows: split over data x fsdp. Each process hands over only the rows its own devices
  hold (`jax.make_array_from_process_local_data`), so multi-host runs need no gathering.

`Layout(None)` is the single-device layout: every method returns its input unchanged, so a run
on one device compiles exactly the program it compiled before meshes existed.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from hone.errors import InputError
from hone.parallel.mesh import BATCH_AXES, batch_shards, build_mesh
from hone.parallel.rules import named_sharding
from hone.train.state import path_key


def logical_names(state: nnx.State) -> dict[str, tuple | None]:
    """{"a/b/kernel": ("embed", "mlp")} for every variable of an nnx.State (None: unnamed)."""
    return {path_key(path): var.get_metadata().get("out_sharding")
            for path, var in nnx.to_flat_state(state)}


class Layout:
    def __init__(self, mesh: Mesh | None, mode: str = "gspmd"):
        self.mesh = mesh
        self.mode = mode
        if mode == "allreduce" and mesh is not None and (
                mesh.shape["fsdp"] > 1 or mesh.shape["tp"] > 1):
            raise InputError(f"the explicit all-reduce mode replicates the parameters on every "
                             f"device, so it needs mesh.fsdp = mesh.tp = 1, got fsdp "
                             f"{mesh.shape['fsdp']} and tp {mesh.shape['tp']}", key="mesh.mode")

    @classmethod
    def from_config(cls, cfg, devices=None) -> "Layout":
        """The layout of cfg.mesh over `devices` (default all); one device = Layout(None)."""
        devices = list(jax.devices() if devices is None else devices)
        mesh = build_mesh(cfg.mesh, devices)
        if mesh.size == 1:
            return cls(None, cfg.mesh.mode)
        return cls(mesh, cfg.mesh.mode)

    # ---- shardings ---------------------------------------------------------------------------

    @property
    def shards(self) -> int:
        """How many ways batch rows are split (1 on one device)."""
        return 1 if self.mesh is None else batch_shards(self.mesh)

    @property
    def replicated(self) -> NamedSharding | None:
        return None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec())

    def rows(self, shape) -> NamedSharding | None:
        """Rows split over data x fsdp when they divide evenly, else replicated."""
        if self.mesh is None:
            return None
        if len(shape) and shape[0] % self.shards == 0:
            return NamedSharding(self.mesh, PartitionSpec(BATCH_AXES))
        return self.replicated

    def micro(self, x) -> NamedSharding:
        """[n, rows, ...] micro-batches: rows split over data x fsdp when they divide."""
        if x.ndim >= 2 and x.shape[1] % self.shards == 0:
            return NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES))
        return self.replicated

    def param(self, names, shape) -> NamedSharding | None:
        return None if self.mesh is None else named_sharding(names, shape, self.mesh)

    def check_rows(self, rows: int, key: str, what: str = "rows") -> None:
        """Batch rows must split evenly over data x fsdp."""
        if rows % self.shards:
            raise InputError(f"{rows} {what} per (micro-)batch do not split evenly over the "
                             f"{self.shards} data x fsdp shards of the mesh", key=key)

    # ---- placing arrays ----------------------------------------------------------------------

    def place_state(self, state: nnx.State) -> nnx.State:
        """An nnx.State with every variable on its sharding."""
        if self.mesh is None:
            return state
        leaves = []
        for path, var in nnx.to_flat_state(state):
            value = var[...]
            if isinstance(value, jax.Array) or isinstance(value, np.ndarray):
                sharding = self.param(var.get_metadata().get("out_sharding"), value.shape)
                value = jax.device_put(value, sharding)
            leaves.append((path, var.replace(value)))
        return nnx.from_flat_state(leaves)

    def place_model(self, model: nnx.Module) -> nnx.Module:
        """Move a model's variables onto the mesh, in place; returns the model."""
        if self.mesh is not None:
            nnx.update(model, self.place_state(nnx.state(model)))
        return model

    def place_train_state(self, state: dict[str, Any], names: dict[str, Any]) -> dict[str, Any]:
        """The train state (params, opt_state, step, rng, ...) on the mesh; `names` are the
        params' logical names (`logical_names` of the trainable nnx.State)."""
        if self.mesh is None:
            return state
        params = {k: jax.device_put(v, self.param(names.get(k), v.shape))
                  for k, v in state["params"].items()}
        by_key = {k: v.sharding for k, v in params.items()}

        def leaf(path, x):
            for entry in reversed(path):
                key = getattr(entry, "key", None)
                if key in by_key and params[key].shape == getattr(x, "shape", None):
                    return jax.device_put(x, by_key[key])
            return jax.device_put(x, self.replicated)

        out = {k: jax.tree_util.tree_map_with_path(leaf, v) for k, v in state.items()
               if k != "params"}
        out["params"] = params
        return out

    def place_tree(self, tree, names: dict[str, Any] | None = None):
        """A flat {key: array} dict by `names`, or any other pytree replicated."""
        if self.mesh is None:
            return tree
        if names is not None and isinstance(tree, dict):
            return {k: jax.device_put(v, self.param(names.get(k), v.shape))
                    for k, v in tree.items()}
        return jax.device_put(tree, self.replicated)

    def place_batch(self, batch: dict) -> dict:
        """Every leaf with rows split over data x fsdp (replicated when they do not divide)."""
        if self.mesh is None:
            return batch
        return jax.tree.map(self._place_rows, batch)

    def _place_rows(self, x):
        if isinstance(x, jax.Array):
            return jax.device_put(x, self.rows(x.shape))
        x = np.asarray(x)
        sharding = self.rows(x.shape)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        # Each process passes the rows its devices hold (a contiguous block in process order).
        index = sharding.addressable_devices_indices_map(x.shape)
        starts = [s[0].start or 0 for s in index.values()] if x.ndim else [0]
        stops = [s[0].stop or x.shape[0] for s in index.values()] if x.ndim else [0]
        local = x[min(starts):max(stops)] if x.ndim else x
        return jax.make_array_from_process_local_data(sharding, local, x.shape)

    # ---- measuring ---------------------------------------------------------------------------

    @staticmethod
    def device_bytes(tree, device=None) -> int:
        """Bytes of `tree` held by one device (default: the first local device)."""
        device = device or jax.local_devices()[0]
        total = 0
        for x in jax.tree.leaves(tree):
            if not isinstance(x, jax.Array):
                continue
            for shard in x.addressable_shards:
                if shard.device == device:
                    total += shard.data.nbytes
        return total
