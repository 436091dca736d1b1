"""A teacher on devices of its own: its weights live on a sub-mesh (the last N devices), sharded
over it by their logical names (fsdp: each of its devices keeps 1/N of the teacher), its forward
pass is a separate jitted program there with the rows split over those devices, and its outputs
(logits or top-k, final hidden states, the matched activations) move to the student's mesh each
step, where the student's step reads them from the batch as `batch["teacher"]`. The student's
step never sees the teacher's weights, so each program compiles for one device set, and the
teacher's memory is off the student's devices.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np

from hone.config.schema import MeshSection
from hone.distill.loss import INPUT_KEYS, teacher_forward
from hone.errors import InputError
from hone.losses.distill import topk_logits
from hone.parallel import Layout, build_mesh


def split_devices(count: int) -> tuple[list, list]:
    """(the teacher's devices: the last `count`, the student's: all the others)."""
    devices = jax.devices()
    if count >= len(devices):
        raise InputError(f"teacher.devices={count} leaves no device for the student: this host "
                         f"has {len(devices)}", key="teacher.devices")
    return devices[len(devices) - count:], devices[:len(devices) - count]


def teacher_layout(devices) -> Layout:
    """The teacher's sub-mesh: fsdp over its devices (weights split, rows split)."""
    if len(devices) == 1:
        return Layout(build_mesh(MeshSection(data=1, fsdp=1, tp=1), devices))
    return Layout(build_mesh(MeshSection(data=1, fsdp=-1, tp=1), devices))


class RemoteTeacher:
    """batch -> {"logits" or "values"/"indices", "final", "hidden", "attention"} on the
    student's mesh (`to_student`, e.g. the student Layout's place_batch); `state` is the
    teacher's weights (an nnx.State), sharded over its sub-mesh by their logical names."""

    def __init__(self, teacher_def, teacher_state, maps: dict, top_k: int | None, devices,
                 to_student: Callable[[dict], dict], vocab=None):
        self.layout = teacher_layout(devices)
        self.to_student = to_student
        self.state = self.layout.place_state(teacher_state)

        def forward(state, mb, k):
            logits, final, caps = teacher_forward(teacher_def, state, mb, maps, vocab)
            out = {"final": final, "hidden": caps["hidden"], "attention": caps["attention"]}
            if k is None:
                out["logits"] = logits
            else:
                out["values"], out["indices"] = topk_logits(logits, k)
            return out

        self.train = jax.jit(lambda state, mb: forward(state, mb, top_k))
        self.full = jax.jit(lambda state, mb: forward(state, mb, None))  # evaluation: all logits

    def __call__(self, batch: dict, full: bool = False) -> dict:
        inputs = self.layout.place_batch({key: np.asarray(batch[key]) for key in INPUT_KEYS})
        out = (self.full if full else self.train)(self.state, inputs)
        # Through the host: the two meshes share no devices.
        return self.to_student(jax.device_get(out))


class WithTeacher:
    """Evaluation data whose batches carry the remote teacher's full outputs."""

    def __init__(self, data, teacher: RemoteTeacher):
        self.data, self.teacher = data, teacher

    def batches(self):
        for batch in self.data.batches():
            yield dict(batch, teacher=self.teacher(batch, full=True))
