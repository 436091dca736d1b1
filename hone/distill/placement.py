"""A teacher on devices of its own (`teacher.devices: N`): a `hone.parallel.roles.FrozenRole`
whose weights are the teacher's, sharded over the last N devices (fsdp: each keeps 1/N), and
whose programs are its forward pass (top-k or full logits, final hidden states, the matched
activations). Its outputs move to the student's mesh each step, where the student's step reads
them from the batch as `batch["teacher"]`; the student's step never sees the teacher's weights.
"""

from __future__ import annotations

from typing import Callable

from hone.distill.loss import INPUT_KEYS, teacher_forward
from hone.losses.distill import topk_logits
from hone.parallel.roles import FrozenRole
from hone.parallel.roles import split_devices as split_role_devices


def split_devices(count: int) -> tuple[list, list]:
    """(the teacher's devices: the last `count`, the student's: all the others)."""
    return split_role_devices(count, "teacher.devices", "the student")


class RemoteTeacher(FrozenRole):
    """batch -> {"logits" or "values"/"indices", "final", "hidden", "attention"} on the
    student's mesh (`to_student`, e.g. the student Layout's place_batch); `state` is the
    teacher's weights (an nnx.State), sharded over its sub-mesh by their logical names."""

    def __init__(self, teacher_def, teacher_state, maps: dict, top_k: int | None, devices,
                 to_student: Callable[[dict], dict], vocab=None):
        def forward(state, mb, k):
            logits, final, caps = teacher_forward(teacher_def, state, mb, maps, vocab)
            out = {"final": final, "hidden": caps["hidden"], "attention": caps["attention"]}
            if k is None:
                out["logits"] = logits
            else:
                out["values"], out["indices"] = topk_logits(logits, k)
            return out

        super().__init__(teacher_state, {
            "train": lambda state, mb: forward(state, mb, top_k),
            "full": lambda state, mb: forward(state, mb, None)},  # evaluation: all logits
            devices, to_student)

    @property
    def state(self):
        return self.weights

    def __call__(self, batch: dict, full: bool = False) -> dict:
        return super().__call__({key: batch[key] for key in INPUT_KEYS},
                                "full" if full else "train")


class WithTeacher:
    """Evaluation data whose batches carry the remote teacher's full outputs."""

    def __init__(self, data, teacher: RemoteTeacher):
        self.data, self.teacher = data, teacher

    def batches(self, max_batches: int | None = None):
        for batch in self.data.batches(max_batches=max_batches):
            yield dict(batch, teacher=self.teacher(batch, full=True))
