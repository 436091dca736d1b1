"""Out of memory: halve the per-device micro-batch, double gradient accumulation, recompile and
go on, so a run whose step does not fit still finishes with the same global batch.

Design choices:
- `AccumStep` is the train step of the recipes built by `compile_steps` (SFT, DPO, reward
  models, distillation): a jitted step for one `grad_accum` that can build its successor with
  twice the accumulation. The global batch, the normalizer and therefore the loss are the same;
  only the summation order of the gradient changes (a run configured with that accumulation
  from the start computes the same bits).
- An allocation failure surfaces as a `JaxRuntimeError` whose text says RESOURCE_EXHAUSTED.
  When it happens before the step ran (compiling, allocating temporaries), the donated train
  state is intact and the same batch is retried at once. When the inputs were already consumed
  the loop rolls back to the newest checkpoint, like a guard does.
- The accumulation is not stored in the checkpoint: a resumed run starts at the configured one
  and halves again on the same error, which gives the same numbers. The console line says
  which `train.grad_accum` to set to skip that.
"""

from __future__ import annotations

from typing import Any, Callable

import jax

from hone.errors import InputError

_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")


class OutOfMemory(InputError):
    """The step does not fit even at one example per device and micro-batch."""


def is_out_of_memory(error: BaseException) -> bool:
    return isinstance(error, jax.errors.JaxRuntimeError) and \
        any(m in str(error) for m in _MARKERS)


class AccumStep:
    """`step(state, frozen, batch, aux)` jitted for `accum` micro-batches per step.

    `examples` is train.batch_size (rows, or pairs for preference data) and `shards` the mesh's
    data x fsdp size: each device's micro-batch holds examples / (accum * shards) of them."""

    def __init__(self, build: Callable[[int], Callable], accum: int, examples: int,
                 shards: int = 1):
        self.build, self.accum, self.examples, self.shards = build, accum, examples, shards
        self.fn = build(accum)

    def __call__(self, *args: Any):
        return self.fn(*args)

    def __getattr__(self, name: str):  # lower(), trace(), ... of the jitted function
        if name == "fn":  # not built yet (copy, pickle): no recursion through self.fn
            raise AttributeError(name)
        return getattr(self.fn, name)

    @property
    def micro(self) -> int:
        """Examples per device in one micro-batch."""
        return self.examples // (self.accum * self.shards)

    def doubled(self, error: BaseException) -> "AccumStep":
        """The step with twice the accumulation; OutOfMemory when the micro-batch cannot
        halve (one example per device, or an odd number)."""
        if self.examples % (2 * self.accum * self.shards):
            what = ("already one example per device"
                    if self.micro <= 1 else f"{self.micro} examples per device do not halve")
            raise OutOfMemory(
                f"the train step ran out of device memory at a micro-batch of {self.micro} "
                f"(train.batch_size {self.examples} over {self.shards} device shard(s) in "
                f"{self.accum} micro-batch(es)); {what}, so it cannot be made smaller. Use "
                f"more devices (mesh.fsdp shards the weights and optimizer state), "
                f"train.remat, LoRA, or a shorter data.max_length. XLA said: "
                f"{str(error).splitlines()[0][:300]}", key="train.batch_size")
        return AccumStep(self.build, 2 * self.accum, self.examples, self.shards)


def state_intact(state: dict[str, Any]) -> bool:
    """Whether no array of the (donated) state was consumed by the failed call."""
    return not any(getattr(x, "is_deleted", lambda: False)() for x in jax.tree.leaves(state))
