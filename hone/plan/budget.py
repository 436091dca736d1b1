"""The plan of one run: its per-device lines grouped into the phases that are alive together,
the peak, whether it fits a device, and the smallest changes that make it fit.

Phases: the weights and optimizer state persist across the whole run; the update adds the
gradients and one micro-batch's activations; an RL rollout (its own program, before the update)
adds the KV cache instead. The peak is the persistent bytes plus the larger phase.

Fit: a plan fits when its peak is at most HEADROOM of the device's memory: the rest is left to
the runtime, compiled code, the batch and fragmentation, which no byte count here sees.

Suggestions try one change at a time in the order of how much they change the run (remat
before micro-batches, before the LM head's chunk, before sharding, before adapters, before
dtypes), each knob from its mildest setting up, then pairs, then triples of them, and report
the first that fit, each with its new peak.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hone.plan.activations import activation_lines
from hone.plan.inputs import PlanInput
from hone.plan.rollout_memory import rollout_lines
from hone.plan.weights import weight_lines

HEADROOM = 0.9  # share of a device's memory a plan may use
MAX_SUGGESTIONS = 4


@dataclass
class Plan:
    input: PlanInput
    persistent: dict[str, float]  # weights, frozen copies, optimizer state
    update: dict[str, float]  # gradients and what one micro-batch keeps for its backward pass
    working: dict[str, float]  # the update's working sets: only the largest is alive at once
    rollout: dict[str, float]  # RL only: KV cache and prefill
    host: dict[str, float] = field(default_factory=dict)  # offloaded to host memory

    @property
    def update_peak(self) -> float:
        return sum(self.update.values()) + max(self.working.values(), default=0.0)

    @property
    def peak(self) -> float:
        """Per-device peak bytes: persistent + the larger phase; both phases when rollouts
        overlap the updates (asynchronous RL on the same devices)."""
        rollout = sum(self.rollout.values())
        if self.input.staleness:
            return sum(self.persistent.values()) + self.update_peak + rollout
        return sum(self.persistent.values()) + max(self.update_peak, rollout)

    def fits(self, device_bytes: float) -> bool:
        return self.peak <= HEADROOM * device_bytes


def make_plan(p: PlanInput) -> Plan:
    weights = weight_lines(p)
    grads = weights.pop("gradients")
    kept, working, host = activation_lines(p)
    return Plan(p, weights, {"gradients": grads, **kept}, working, rollout_lines(p), host)


def _divisors_up(n: int, start: int) -> list[int]:
    return [d for d in range(start + 1, n + 1) if n % d == 0]


def knobs(p: PlanInput) -> list[list[tuple[str, dict]]]:
    """The knobs suggestions may turn, in the order they prefer; each a list of settings from
    the mildest up ((what to set, PlanInput changes))."""
    out: list[list[tuple[str, dict]]] = []
    if p.remat == "none" or not p.scan:
        out.append([("train.remat=save_dots", dict(remat="save_dots", scan=True)),
                    ("train.remat=save_attention", dict(remat="save_attention", scan=True)),
                    ("train.remat=full", dict(remat="full", scan=True))])
    per_device = p.rows // p.batch_shards
    accums = _divisors_up(max(per_device, 1), p.grad_accum)
    if accums:  # smaller micro-batches, same batch
        out.append([(f"train.grad_accum={a}", dict(grad_accum=a)) for a in accums])
    chunk = p.head_chunk if 0 < p.head_chunk < p.head_len else p.head_len
    chunks = [c for c in (512, 256, 128) if c < chunk]
    if chunks:  # a smaller LM-head chunk: fewer [rows, chunk, V] logits alive at once
        out.append([(f"train.head_chunk={c}", dict(head_chunk=c)) for c in chunks])
    if p.data > 1:  # more of the devices into fsdp: weights, gradients and Adam sharded further
        out.append([(f"mesh.fsdp={p.fsdp * p.data} mesh.data=1",
                     dict(fsdp=p.fsdp * p.data, data=1))])
    if not p.lora_rank:
        out.append([("model.lora.rank=16", dict(lora_rank=16)),
                    ("model.lora.rank=16 model.lora.quantize=nf4",
                     dict(lora_rank=16, quantize="nf4"))])
    elif p.quantize == "none":
        out.append([("model.lora.quantize=nf4", dict(quantize="nf4"))])
    dtypes = []
    if p.precision != "bf16":
        dtypes.append(("train.precision=bf16", dict(precision="bf16")))
    if p.param_dtype != "bfloat16":
        dtypes.append(("model.dtype=bfloat16", dict(param_dtype="bfloat16")))
    if dtypes:
        out.append(dtypes)
    return out


def suggestions(p: PlanInput, device_bytes: float,
                limit: int = MAX_SUGGESTIONS) -> list[tuple[str, float]]:
    """The smallest changes after which the plan fits: one knob at its mildest fitting
    setting, else two knobs, else three; [(the key=value settings, new peak bytes)]."""
    found: list[tuple[str, float]] = []
    for size in (1, 2, 3):
        for combo in itertools.combinations(knobs(p), size):
            for settings in itertools.product(*combo):
                merged = {k: v for _, c in settings for k, v in c.items()}
                plan = make_plan(p.with_(**merged))
                if plan.fits(device_bytes):
                    found.append((" ".join(name for name, _ in settings), plan.peak))
                    break
            if len(found) >= limit:
                return found
        if found:
            return found
    return found
