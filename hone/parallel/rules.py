"""The one table from logical axis names (what the model code writes) to mesh axes.

Model code names every parameter axis (`embed`, `heads`, `mlp`, `vocab`, ...); nothing outside
hone/parallel names a mesh axis. `partition_spec` turns a parameter's names and shape into a
PartitionSpec for a given mesh, and keeps it valid on any mesh:
- a mesh axis of size 1 is left out (nothing to split);
- a mesh axis already used by an earlier dimension of the same array is left out;
- a dimension whose size the mesh axes do not divide loses axes from the end of its list until
  they do, down to none (replicated). A 4-head model on tp=8 keeps whole heads on every device,
  and the result is still exact; only the memory saving is lost for that array.
"""

from __future__ import annotations

import math
from typing import Sequence

from jax.sharding import Mesh, NamedSharding, PartitionSpec

# logical name -> mesh axes, in order. Names not listed are replicated.
RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp"),
    "vocab": ("tp",),
    "embed": ("fsdp",),
    "mlp": ("tp",),
    "heads": ("tp",),
    "kv_heads": ("tp",),
    # Replicated on purpose: per-head width, adapter rank, the reward head's single output,
    # sequence positions.
    "head_dim": (),
    "lora_rank": (),
    "score": (),
    "seq": (),
}


def partition_spec(names: Sequence[str | None] | None, shape: Sequence[int],
                   mesh: Mesh) -> PartitionSpec:
    """The PartitionSpec of an array with logical axis `names` and `shape` on `mesh`."""
    if names is None or len(names) != len(shape):
        return PartitionSpec()
    used: set[str] = set()
    spec = []
    for name, size in zip(names, shape):
        axes = [a for a in RULES.get(name, ()) if mesh.shape.get(a, 1) > 1 and a not in used]
        while axes and size % math.prod(mesh.shape[a] for a in axes):
            axes.pop()
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def named_sharding(names, shape, mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(names, shape, mesh))
