"""The one table from logical axis names (what the model code writes) to mesh axes.

Model code names every parameter axis (`embed`, `heads`, `mlp`, `vocab`, ...); nothing outside
hone/parallel names a mesh axis. `partition_spec` turns a parameter's names and shape into a
PartitionSpec for a given mesh, and keeps it valid on any mesh:
- a mesh axis of size 1 is left out (nothing to split);
- a mesh axis already used by an earlier dimension of the same array is left out;
- a dimension whose size the mesh axes do not divide loses axes from the end of its list until
  they do, down to none (replicated). A 4-head model on tp=8 keeps whole heads on every device,
  and the result is still exact; only the memory saving is lost for that array. That loss is
  said, not silent: a `UserWarning` naming the array (layer numbers folded, so a 30-layer model
  warns once per kind of weight), its shape, bytes and the axes left out, once per name per
  process, for arrays of at least WARN_BYTES (below that the copy costs little and tiny test
  models would warn on every run).
"""

from __future__ import annotations

import math
import re
import warnings
from typing import Sequence

from jax.sharding import Mesh, NamedSharding, PartitionSpec

# logical name -> mesh axes, in order. Names not listed are replicated.
RULES: dict[str, tuple[str, ...]] = {
    "batch": ("data", "fsdp", "expert"),
    "vocab": ("tp",),
    "embed": ("fsdp",),
    "mlp": ("tp",),
    "heads": ("tp",),
    # Mixture-of-experts: the stacked experts' leading [E, ...] dimension and the router's
    # output (hone/models/moe.py); whole experts per device.
    "expert": ("expert",),
    "kv_heads": ("tp",),
    # Activations' token dimension: split over the sequence-parallel axis (mesh.seq).
    "seq": ("seq",),
    # Replicated on purpose: per-head width, adapter rank, the reward head's single output.
    "head_dim": (),
    "lora_rank": (),
    "score": (),
}

# Arrays smaller than this are replicated without a warning when an axis does not divide them.
WARN_BYTES = 1 << 20
_warned: set[str] = set()


def partition_spec(names: Sequence[str | None] | None, shape: Sequence[int], mesh: Mesh, *,
                   what: str | None = None, nbytes: int | None = None) -> PartitionSpec:
    """The PartitionSpec of an array with logical axis `names` and `shape` on `mesh`. what and
    nbytes (the array's path and size) make a dropped axis a warning (module docstring)."""
    if names is None or len(names) != len(shape):
        return PartitionSpec()
    used: set[str] = set()
    spec = []
    for name, size in zip(names, shape):
        axes = [a for a in RULES.get(name, ()) if mesh.shape.get(a, 1) > 1 and a not in used]
        dropped = []
        while axes and size % math.prod(mesh.shape[a] for a in axes):
            dropped.append(axes.pop())
        if dropped and nbytes is not None and nbytes >= WARN_BYTES:
            _warn_replicated(what, names, shape, nbytes, name, size, dropped, mesh)
        used.update(axes)
        spec.append(None if not axes else axes[0] if len(axes) == 1 else tuple(axes))
    while spec and spec[-1] is None:
        spec.pop()
    return PartitionSpec(*spec)


def named_sharding(names, shape, mesh: Mesh, *, what: str | None = None,
                   nbytes: int | None = None) -> NamedSharding:
    return NamedSharding(mesh, partition_spec(names, shape, mesh, what=what, nbytes=nbytes))


def _warn_replicated(what, names, shape, nbytes, name, size, dropped, mesh) -> None:
    key = re.sub(r"(^|/)\d+(/|$)", r"\1*\2", what) if what else f"{tuple(names)} {tuple(shape)}"
    if key in _warned:
        return
    _warned.add(key)
    axes = " x ".join(f"mesh.{a}={mesh.shape[a]}" for a in reversed(dropped))
    warnings.warn(f"{key} {list(shape)} ({nbytes:,} bytes) is not split over {axes}: its "
                  f"{name} dimension ({size}) is not a multiple, so each device keeps a whole "
                  f"copy along it", stacklevel=3)
