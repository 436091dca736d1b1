"""A teacher on devices of its own: its weights live on a sub-mesh (the last N devices of the
host), its forward pass is a separate jitted program there, data parallel over those devices,
and its outputs (logits or top-k, final hidden states, the matched activations) move to the
student's device each step, where the student's step reads them from the batch as
`batch["teacher"]`. The student's step never sees the teacher's weights, so each program
compiles for one device set, and the teacher's memory is off the student's devices.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from hone.distill.loss import INPUT_KEYS, teacher_forward
from hone.errors import InputError
from hone.losses.distill import topk_logits


def split_devices(count: int) -> tuple[list, jax.Device]:
    """(the teacher's devices: the last `count`, the student's device: the first)."""
    devices = jax.devices()
    if count >= len(devices):
        raise InputError(f"teacher.devices={count} leaves no device for the student: this host "
                         f"has {len(devices)}", key="teacher.devices")
    return devices[-count:], devices[0]


class RemoteTeacher:
    """batch -> {"logits" or "values"/"indices", "final", "hidden", "attention"} on the
    student's device; `state` is the teacher's weights, replicated over its sub-mesh."""

    def __init__(self, teacher_def, teacher_state, maps: dict, top_k: int | None, devices,
                 student_device, vocab=None):
        mesh = Mesh(np.array(devices), ("data",))
        self.count = len(devices)
        self.replicated = NamedSharding(mesh, PartitionSpec())
        self.rows = NamedSharding(mesh, PartitionSpec("data"))
        self.student = SingleDeviceSharding(student_device)
        self.state = jax.device_put(teacher_state, self.replicated)

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
        inputs = {key: np.asarray(batch[key]) for key in INPUT_KEYS}
        rows = len(inputs["tokens"])
        sharding = self.rows if rows % self.count == 0 else self.replicated
        inputs = jax.device_put(inputs, sharding)
        out = (self.full if full else self.train)(self.state, inputs)
        return jax.device_put(out, self.student)


class WithTeacher:
    """Evaluation data whose batches carry the remote teacher's full outputs."""

    def __init__(self, data, teacher: RemoteTeacher):
        self.data, self.teacher = data, teacher

    def batches(self):
        for batch in self.data.batches():
            yield dict(batch, teacher=self.teacher(batch, full=True))
