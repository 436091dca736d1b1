"""Where every array of a run lives on the mesh.

- Parameters (trainable and frozen, and any copy such as a DPO reference): by their logical
  axis names through the rules table (`hone/parallel/rules.py`).
- Optimizer state: each leaf that mirrors a parameter (Adam's moments are dicts keyed like the
  parameters) is sharded like that parameter; scalars (the step count) are replicated. So the
  optimizer bytes per device fall with fsdp exactly as the parameter bytes do.
- Batch rows: split over data x fsdp x expert; with mesh.seq > 1 also each row's tokens over
  seq (every [B, T, ...] array of a batch whose T is the length of its `tokens`). Each process
  hands over only the part its own devices hold (`jax.make_array_from_process_local_data`), so
  multi-host runs need no gathering.
- Expert parallelism (mesh.expert > 1) is the stacked expert weights' sharding and nothing
  more: GSPMD partitions the routed MLP from it (docs/guides/moe.md); `check_experts` refuses
  a dense model or an expert count the axis does not divide.
  On CPU a routed MLP then computes through ragged_dot's lowering (a product per expert, masked),
  which GSPMD splits along the experts; the CPU tile loop's per-expert weight slices would make
  it gather every expert's weights on each device (`place_model`).
- Sequence parallelism needs attention across the seq axis: `place_model` gives the model the
  ring attention of hone/parallel/ring_attention.py (the model itself never names the axis).

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
from hone.models.paths import path_key
from hone.parallel.mesh import BATCH_AXES, batch_shards, build_mesh, seq_shards
from hone.parallel.rules import named_sharding


def logical_names(state: nnx.State) -> dict[str, tuple | None]:
    """{"a/b/kernel": ("embed", "mlp")} for every variable of an nnx.State (None: unnamed)."""
    return {path_key(path): var.get_metadata().get("out_sharding")
            for path, var in nnx.to_flat_state(state)}


class Layout:
    def __init__(self, mesh: Mesh | None, mode: str = "gspmd"):
        self.mesh = mesh
        self.mode = mode
        split = {a: mesh.shape.get(a, 1) for a in ("fsdp", "expert", "tp")} if mesh else {}
        if mode == "allreduce" and any(n > 1 for n in split.values()):
            got = ", ".join(f"{a} {n}" for a, n in split.items())
            raise InputError(f"the explicit all-reduce mode replicates the parameters on every "
                             f"device, so it needs mesh.fsdp = mesh.expert = mesh.tp = 1, got "
                             f"{got}", key="mesh.mode")
        if mode == "allreduce" and mesh is not None and seq_shards(mesh) > 1:
            raise InputError(f"the explicit all-reduce mode splits rows only, so it needs "
                             f"mesh.seq = 1, got {seq_shards(mesh)}", key="mesh.mode")

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
    def seq(self) -> int:
        """How many ways each row's tokens are split (1 on one device)."""
        return 1 if self.mesh is None else seq_shards(self.mesh)

    @property
    def replicated(self) -> NamedSharding | None:
        return None if self.mesh is None else NamedSharding(self.mesh, PartitionSpec())

    def rows(self, shape) -> NamedSharding | None:
        """Rows split over data x fsdp x expert when they divide evenly, else replicated."""
        if self.mesh is None:
            return None
        if len(shape) and shape[0] % self.shards == 0:
            return NamedSharding(self.mesh, PartitionSpec(BATCH_AXES))
        return self.replicated

    def tokens(self, shape) -> NamedSharding | None:
        """[B, T, ...] token arrays: rows over data x fsdp x expert (when they divide), T over
        seq."""
        if self.mesh is None:
            return None
        rows = BATCH_AXES if shape[0] % self.shards == 0 else None
        return NamedSharding(self.mesh, PartitionSpec(rows, "seq"))

    def micro(self, x) -> NamedSharding:
        """[n, rows, ...] micro-batches: rows split over data x fsdp x expert when they divide.
        With mesh.seq > 1 the dimensions after the rows are left to GSPMD (unconstrained), so token
        arrays keep the seq split place_batch gave them."""
        rows = BATCH_AXES if x.ndim >= 2 and x.shape[1] % self.shards == 0 else None
        if self.seq > 1 and x.ndim >= 3:
            return NamedSharding(self.mesh, PartitionSpec(None, rows, PartitionSpec.UNCONSTRAINED))
        if rows is not None:
            return NamedSharding(self.mesh, PartitionSpec(None, BATCH_AXES))
        return self.replicated

    def param(self, names, shape, what: str | None = None,
              nbytes: int | None = None) -> NamedSharding | None:
        """The sharding of a parameter by its logical names; what/nbytes (its path and size)
        let the rules warn when an axis does not divide it (hone/parallel/rules.py)."""
        if self.mesh is None:
            return None
        return named_sharding(names, shape, self.mesh, what=what, nbytes=nbytes)

    def check_rows(self, rows: int, key: str, what: str = "rows") -> None:
        """Batch rows must split evenly over data x fsdp x expert."""
        if rows % self.shards:
            raise InputError(f"{rows} {what} per (micro-)batch do not split evenly over the "
                             f"{self.shards} data x fsdp x expert shards of the mesh", key=key)

    def check_experts(self, model: nnx.Module) -> None:
        """mesh.expert > 1 needs a mixture-of-experts model (a Transformer, or a module holding
        one, whose ModelConfig has `moe`) whose number of experts it divides: whole experts
        per device, never a silent replica."""
        split = 1 if self.mesh is None else self.mesh.shape.get("expert", 1)
        if split == 1:
            return
        moe = next((node.config.moe for _, node in nnx.iter_graph(model)
                    if getattr(getattr(node, "config", None), "moe", None) is not None), None)
        if moe is None:
            raise InputError(f"splits the experts of a mixture-of-experts model over {split} "
                             f"devices, but this model is dense (no routed MLP): set "
                             f"mesh.expert = 1", key="mesh.expert")
        if moe.num_experts % split:
            raise InputError(f"{split} does not divide the model's {moe.num_experts} experts; "
                             f"each device must keep whole experts", key="mesh.expert")

    # ---- placing arrays ----------------------------------------------------------------------

    def place_state(self, state: nnx.State) -> nnx.State:
        """An nnx.State with every variable on its sharding."""
        if self.mesh is None:
            return state
        leaves = []
        for path, var in nnx.to_flat_state(state):
            value = var[...]
            if isinstance(value, jax.Array) or isinstance(value, np.ndarray):
                sharding = self.param(var.get_metadata().get("out_sharding"), value.shape,
                                      path_key(path), value.nbytes)
                value = jax.device_put(value, sharding)
            leaves.append((path, var.replace(value)))
        return nnx.from_flat_state(leaves)

    def place_model(self, model: nnx.Module) -> nnx.Module:
        """Move a model's variables onto the mesh, in place; returns the model. With mesh.seq > 1
        a Transformer also gets the ring attention over the seq axis; with mesh.expert > 1 the
        routed MLPs left to choose their method compute through ragged_dot (module docstring)."""
        if self.mesh is not None:
            nnx.update(model, self.place_state(nnx.state(model)))
        if self.mesh is not None and self.mesh.shape.get("expert", 1) > 1:
            from hone.models.moe import RoutedMLP
            for _, node in nnx.iter_graph(model):
                if isinstance(node, RoutedMLP) and node.method is None:
                    node.method = "ragged"
        if self.seq > 1:
            from hone.parallel.ring_attention import RingAttention
            for _, node in nnx.iter_graph(model):  # the Transformer itself or one inside
                if isinstance(node, nnx.Module) and hasattr(node, "sequence_attention"):
                    node.sequence_attention = RingAttention(self.mesh)
        return model

    def place_train_state(self, state: dict[str, Any], names: dict[str, Any]) -> dict[str, Any]:
        """The train state (params, opt_state, step, rng, ...) on the mesh; `names` are the
        params' logical names (`logical_names` of the trainable nnx.State)."""
        if self.mesh is None:
            return state
        from hone.models.stacked import stacked_names
        names = stacked_names(names, state["params"])
        params = {k: jax.device_put(v, self.param(names.get(k), v.shape, k, v.nbytes))
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
            return {k: jax.device_put(v, self.param(names.get(k), v.shape, k, v.nbytes))
                    for k, v in tree.items()}
        return jax.device_put(tree, self.replicated)

    def place_batch(self, batch: dict) -> dict:
        """Every leaf with rows split over data x fsdp x expert (replicated when they do not
        divide); with mesh.seq > 1, [B, T, ...] leaves (T: the length of batch["tokens"]) also split
        their tokens over seq."""
        if self.mesh is None:
            return batch
        length = None
        if self.seq > 1 and isinstance(batch, dict) and "tokens" in batch:
            b, length = np.shape(batch["tokens"])[:2]
            if length % self.seq:
                raise InputError(
                    f"rows of {length} tokens do not split over mesh.seq = {self.seq}: the row "
                    f"length (data.max_length; for RL the prompt plus completion tokens) must "
                    f"be a multiple of mesh.seq", key="mesh.seq")

        def place(x):
            shape = np.shape(x)
            if length is not None and len(shape) >= 2 and shape[:2] == (b, length):
                return self._put(x, self.tokens(shape))
            return self._put(x, self.rows(shape))

        return jax.tree.map(place, batch)

    def _put(self, x, sharding):
        if isinstance(x, jax.Array):
            return jax.device_put(x, sharding)
        x = np.asarray(x)
        if jax.process_count() == 1:
            return jax.device_put(x, sharding)
        if not x.ndim:
            return jax.make_array_from_process_local_data(sharding, x, x.shape)
        # Each process passes the block its devices hold (contiguous in process order).
        index = list(sharding.addressable_devices_indices_map(x.shape).values())
        block = tuple(slice(min(s[d].start or 0 for s in index),
                            max(x.shape[d] if s[d].stop is None else s[d].stop for s in index))
                      for d in range(x.ndim))
        return jax.make_array_from_process_local_data(sharding, x[block], x.shape)

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
