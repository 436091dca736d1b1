"""The train state: everything a run needs to continue exactly, as plain pytrees.

Trainable parameters live in a flat dict keyed by "/"-joined paths ("layers/3/attn/q/kernel").
Flat string keys make checkpoints readable and independent of Flax's containers, and the
optimizer state mirrors the same keys. The frozen rest of the model (the base weights when
training adapters) is not part of the state: it is rebuilt from the model source on resume,
so a LoRA checkpoint holds only adapters.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.paths import path_key
from hone.train.guards import init_state


def flatten(state: nnx.State) -> dict[str, jax.Array]:
    """nnx.State -> {"a/b/0/c": array}."""
    return {path_key(path): var[...] for path, var in nnx.to_flat_state(state)}


def train_params(model: nnx.Module, params: nnx.State) -> dict[str, jax.Array]:
    """The flat trainable parameters a train state starts from: `flatten(params)`, with the
    blocks of a model that scans them (train.scan_layers) stored stacked
    (hone.models.stacked), so the step and the optimizer do not grow with depth."""
    from hone.models.stacked import plan_of, stack_flat
    return stack_flat(flatten(params), plan_of(model))


def unflatten(template: nnx.State, flat: dict[str, jax.Array]) -> nnx.State:
    """Put arrays from a flat dict back into the structure of `template` (an nnx.State).
    Parameters stored stacked over scanned blocks (hone.models.stacked) are sliced into their
    blocks."""
    from hone.models.stacked import unstack_flat
    flat = unstack_flat(flat)
    leaves = [(path, var.replace(flat[path_key(path)]))
              for path, var in nnx.to_flat_state(template)]
    return nnx.from_flat_state(leaves)


def split_model(model: nnx.Module, trainable) -> tuple[Any, nnx.State, nnx.State]:
    """(graphdef, trainable state, everything else) for an nnx filter `trainable`."""
    graphdef, train_state, rest = nnx.split(model, trainable, ...)
    return graphdef, train_state, rest


def new_train_state(params: dict[str, jax.Array], optimizer, seed: int,
                    guard=None) -> dict[str, Any]:
    """The checkpointed state of a fresh run. `guard` is a GuardSection (default limits when
    None; the loop writes the config's limits in before training)."""
    return {
        "step": jnp.zeros((), jnp.int32),
        "params": params,
        "opt_state": optimizer.init(params),
        # Raw key data (uint32) rather than a typed key: plain arrays checkpoint anywhere.
        "rng": jax.random.key_data(jax.random.key(seed)),
        # Skips, rollbacks, loss EMA and learning-rate scale: checkpointed so a resumed run
        # makes the same decisions.
        "guard": init_state(guard),
    }


def tree_bytes(tree) -> int:
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in jax.tree.leaves(tree))


# Modules above the blocks: they train whenever the top block does.
_ABOVE_BLOCKS = ("final_norm", "lm_head", "head")


def top_blocks(model, count: int):
    """An nnx filter for the parameters of the top `count` transformer blocks of `model` and
    of everything above them (final norm, untied LM head, a reward model's "head"), at any
    depth of nesting; the embedding and the lower blocks fail it, so they stay frozen."""
    blocks = len(model.layers)
    if count > blocks:
        raise InputError(f"{count} is more than the model's {blocks} transformer blocks",
                         key="model.train_layers")
    cut = blocks - count

    def predicate(path, _value) -> bool:
        for key, below in zip(path, path[1:]):
            if key == "layers" and isinstance(below, int):
                return below >= cut
        return any(key in _ABOVE_BLOCKS for key in path)

    return predicate


def also_train(trainable, name: str):
    """`trainable` widened to every parameter under a module called `name` (a head that always
    trains beside adapters or the top blocks); plain nnx.Param already covers it."""
    return trainable if trainable is nnx.Param else nnx.Any(trainable, nnx.PathContains(name))
