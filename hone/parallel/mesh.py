"""The device mesh from the `mesh:` config section: axes `data`, `fsdp`, `expert`, `seq`, `tp`.

- `data`: batch rows are split over it, parameters are replicated (plain data parallel).
- `fsdp`: batch rows are split over it too, and parameters and optimizer state are sharded over
  it (each device keeps 1/fsdp of them; XLA gathers a layer's weights when it needs them).
- `expert` (mixture-of-experts models): the stacked expert weights [E, ...] are split over it
  (each device keeps E/expert whole experts); for everything else it is one more data axis
  (batch rows split over it, other parameters replicated), as in DeepSpeed-MoE and MaxText, so
  its devices never repeat each other's attention work. GSPMD partitions the routed MLP from
  the weights' sharding (docs/guides/moe.md, Parallelism: on GPU and TPU XLA gathers the
  experts around each grouped product, so there the axis saves memory at rest only).
- `seq`: each row's tokens are split over it (sequence parallelism, for rows too long for one
  device): activations are [B, T/seq, ...] per device; attention passes keys and values around
  the axis (hone/parallel/ring_attention.py); parameters are replicated over it.
- `tp`: attention heads, MLP width and vocabulary are split over it (tensor parallel).

A size of -1 takes the devices left over (the default for `data`, so a plain run uses every
device). Devices are taken in process order, so that multi-host runs see one global mesh; fixed
sizes whose product is smaller than the device count use the first devices only. Axis types are
Auto: GSPMD propagates shardings from the parameters and the batch (an Explicit mesh would reject
a matmul over a sharded contracting dimension).
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from hone.errors import InputError

# Order = device order: tp innermost (the most traffic, every layer), then seq (keys and values
# passed around a ring every layer), expert (token activations exchanged every routed layer),
# then fsdp and data.
AXES = ("data", "fsdp", "expert", "seq", "tp")
BATCH_AXES = ("data", "fsdp", "expert")  # the mesh axes batch rows are split over


def axis_sizes(section, count: int) -> tuple[int, int, int, int, int]:
    """(data, fsdp, expert, seq, tp) for `count` devices: -1 resolved, product checked."""
    sizes = [getattr(section, axis) for axis in AXES]
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if count % fixed:
            rest = AXES[sizes.index(-1)]
            raise InputError(f"{count} device(s) cannot be split evenly with the other axes "
                             f"({fixed} devices per {rest} slot)", key=f"mesh.{rest}")
        sizes[sizes.index(-1)] = count // fixed
    if math.prod(sizes) > count:
        each = ", ".join(f"mesh.{a} = {n}" for a, n in zip(AXES, sizes))
        raise InputError(f"{each} need {math.prod(sizes)} devices (their product), but there "
                         f"are only {count} device(s)", key="mesh")
    return tuple(sizes)


def build_mesh(section, devices: Sequence | None = None) -> Mesh:
    """A 5-axis mesh (AXES) over `devices` (default: every device of every process). Fixed sizes
    whose product is smaller than the device count use the first devices only."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = axis_sizes(section, len(devices))
    devices = devices[:math.prod(sizes)]
    auto = (AxisType.Auto,) * len(AXES)
    if len(devices) == len(jax.devices()):
        return jax.make_mesh(sizes, AXES, axis_types=auto, devices=devices)
    return Mesh(np.array(devices).reshape(sizes), AXES, axis_types=auto)


def batch_shards(mesh: Mesh) -> int:
    """How many ways batch rows are split: data x fsdp x expert."""
    return math.prod(mesh.shape.get(a, 1) for a in BATCH_AXES)


def seq_shards(mesh) -> int:
    """How many ways each row's tokens are split: seq (1 on a mesh without the axis)."""
    return mesh.shape.get("seq", 1)
