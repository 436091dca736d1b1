"""Roles on devices of their own: a frozen model (a distillation teacher, an RL reference) whose
weights live on a sub-mesh of this host's last N devices, its forward passes separate jitted
programs there, while the model being trained gets a mesh over the devices left.

Design choices:
- The role's sub-mesh is fsdp over its devices: each keeps 1/N of the weights (split by their
  logical names through the same rules table as the trainee's), and its input rows are split
  over them too.
- The trainee's step never sees the role's weights (they are not one of its arguments), so each
  program compiles for one device set and the role's memory is off the trainee's devices.
- Inputs arrive as host rows and outputs go back through the host (`jax.device_get`): the two
  meshes share no device, and the trainee's own placement (its Layout's `place_batch`, given as
  `to_caller` or applied by the training loop) puts them where its step wants them.
- Weights move device to device (`jax.device_put` onto the role's shardings): once for frozen
  weights, or each step with `transfer` for weights that change (PPO's EMA reference).
- One process: the outputs are read on this host, and the role takes this host's last devices.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
from flax import nnx

from hone.config.schema import MeshSection
from hone.errors import InputError
from hone.parallel.layout import Layout
from hone.parallel.mesh import build_mesh


def split_devices(count: int, key: str, trainee: str = "the model being trained",
                  devices=None) -> tuple[list, list]:
    """(the role's devices: the last `count` of `devices` (default: this host's), the
    trainee's: all the others). `key` is the config key that asked, named in the errors."""
    devices = jax.devices() if devices is None else list(devices)
    if jax.process_count() > 1:
        raise InputError(f"{key}={count}: a role on devices of its own needs a single process "
                         f"(its outputs come back through this host); this run has "
                         f"{jax.process_count()}", key=key)
    if count >= len(devices):
        raise InputError(f"{key}={count} leaves no device for {trainee}: this host has "
                         f"{len(devices)}", key=key)
    return devices[len(devices) - count:], devices[:len(devices) - count]


def role_layout(devices) -> Layout:
    """A role's sub-mesh: fsdp over its devices (weights split, rows split). One device still
    gets a mesh (of one), so the weights are moved onto it rather than left where they were."""
    return Layout(build_mesh(MeshSection(data=1, fsdp=-1, tp=1), devices))


class FrozenRole:
    """A frozen model on devices of its own.

    weights: an nnx.State, or a dict of nnx.States, placed on the role's sub-mesh by the
        variables' logical names.
    programs: name -> fn(weights, inputs) -> outputs (any pytree); each jitted once, running on
        the role's devices. Calling the role runs the first unless another is named.
    to_caller: applied to the outputs once they are host arrays (e.g. the trainee Layout's
        place_batch); default: leave them on the host.
    """

    def __init__(self, weights, programs: dict[str, Callable], devices,
                 to_caller: Callable | None = None):
        self.devices = list(devices)
        self.layout = role_layout(self.devices)
        self.to_caller = to_caller or (lambda out: out)
        self.weights = self.place(weights)
        self.programs = {name: jax.jit(fn) for name, fn in programs.items()}

    def place(self, weights):
        """`weights` (an nnx.State or a dict of them) on the role's shardings; arrays on other
        devices are copied device to device."""
        if isinstance(weights, nnx.State):
            return self.layout.place_state(weights)
        if isinstance(weights, dict):
            return {name: self.place(part) for name, part in weights.items()}
        raise TypeError(f"a role's weights are an nnx.State or a dict of them, got "
                        f"{type(weights).__name__}")

    def transfer(self, name: str, part) -> None:
        """Replace one part of dict weights with new values (the weight transfer of a reference
        that changes during training); the other parts stay where they are."""
        self.weights = dict(self.weights, **{name: self.place(part)})

    def __call__(self, inputs: dict, program: str | None = None):
        """Outputs of `program` on host rows `inputs` ([B, ...] leaves)."""
        run = self.programs[program or next(iter(self.programs))]
        placed = self.layout.place_batch({k: np.asarray(v) for k, v in inputs.items()})
        # Through the host: the role's mesh and the trainee's share no devices.
        return self.to_caller(jax.device_get(run(self.weights, placed)))
