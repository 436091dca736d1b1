"""Orbax checkpoints of the whole run state: parameters (adapters only when training adapters),
optimizer state, step, RNG key, and the data iterator's position.

Orbax writes each checkpoint to a temporary folder and renames it when complete, so a
checkpoint is either whole or absent. Saves are asynchronous: training continues while the
previous step's arrays are written. The newest `keep` checkpoints are kept.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

# Orbax logs every save at INFO; a progress bar is the place for that.
logging.getLogger("absl").setLevel(logging.WARNING)


class Checkpointer:
    def __init__(self, directory: str | Path, *, keep: int, async_save: bool = True):
        self.directory = Path(directory).absolute()
        self.manager = ocp.CheckpointManager(
            self.directory,
            options=ocp.CheckpointManagerOptions(max_to_keep=keep,
                                                 enable_async_checkpointing=async_save),
            item_names=("state", "data"))

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict[str, Any], data_state: dict) -> None:
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)))

    def restore(self, step: int, like: dict[str, Any]) -> tuple[dict[str, Any], dict]:
        """(state, data_state) of `step`; `like` gives the structure, shapes and shardings."""
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
        return out.state, out.data

    def read(self, step: int | None = None) -> tuple[dict[str, Any], dict]:
        """(state, data_state) of `step` (default: newest) as saved, without a template:
        for exports and inspection."""
        step = self.latest_step() if step is None else step
        if step is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(), data=ocp.args.JsonRestore()))
        return out.state, out.data

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
