"""The device mesh from the `mesh:` config section: axes `data`, `fsdp` and `tp`.

- `data`: batch rows are split over it, parameters are replicated (plain data parallel).
- `fsdp`: batch rows are split over it too, and parameters and optimizer state are sharded over
  it (each device keeps 1/fsdp of them; XLA gathers a layer's weights when it needs them).
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

AXES = ("data", "fsdp", "tp")
BATCH_AXES = ("data", "fsdp")  # the mesh axes batch rows are split over


def axis_sizes(section, count: int) -> tuple[int, int, int]:
    """(data, fsdp, tp) for `count` devices: -1 resolved, product checked."""
    sizes = [getattr(section, axis) for axis in AXES]
    fixed = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if count % fixed:
            rest = AXES[sizes.index(-1)]
            raise InputError(f"{count} device(s) cannot be split evenly with the other axes "
                             f"({fixed} devices per {rest} slot)", key=f"mesh.{rest}")
        sizes[sizes.index(-1)] = count // fixed
    if math.prod(sizes) > count:
        raise InputError(f"data x fsdp x tp = {' x '.join(map(str, sizes))} = "
                         f"{math.prod(sizes)}, but there are only {count} device(s)", key="mesh")
    return tuple(sizes)


def build_mesh(section, devices: Sequence | None = None) -> Mesh:
    """A 3-axis mesh over `devices` (default: every device of every process). Fixed sizes
    whose product is smaller than the device count use the first devices only."""
    devices = list(jax.devices() if devices is None else devices)
    sizes = axis_sizes(section, len(devices))
    devices = devices[:math.prod(sizes)]
    if len(devices) == len(jax.devices()):
        return jax.make_mesh(sizes, AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)
    return Mesh(np.array(devices).reshape(sizes), AXES, axis_types=(AxisType.Auto,) * 3)


def batch_shards(mesh: Mesh) -> int:
    """How many ways batch rows are split: data x fsdp."""
    return mesh.shape["data"] * mesh.shape["fsdp"]
