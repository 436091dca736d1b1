"""The RL reference on devices of its own (`<section>.reference_devices: N`): its weights on the
last N devices, the policy's mesh over the others, and each rollout's reference log-probabilities
computed there between the rollout and the step, so they reach the step with the batch
(`batch["ref_logp"]`) and the step's in-jit scoring runs no reference forward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from hone.parallel.roles import FrozenRole, split_devices
from hone.rl.step import chunked
from hone.train.reference import reference_model
from hone.train.scoring import branch_logprobs, row_logprobs
from hone.train.state import flatten, unflatten
from hone.train.step import merge


def reference_split(cfg) -> tuple[list | None, list | None]:
    """(the reference's devices, the policy's) for `<section>.reference_devices` > 0, else
    (None, None): every device is the policy's."""
    count = getattr(cfg, cfg.SECTION).reference_devices
    if not count:
        return None, None
    return split_devices(count, f"{cfg.SECTION}.reference_devices", "the policy")


class RemoteReference(FrozenRole):
    """The reference model on devices of its own: rollout rows -> ref_logp [B, L] (host), or
    from tree rows (`pack_tree_rows`) the samples' log-probabilities [groups, G, M].

    Its weights are the policy's frozen rest plus `params`, the reference's values of the
    policy's trainable weights (flat, keyed like `template`): the starting weights ("copy"),
    the EMA ("ema", sent again each step with `transfer_params`), or, for "adapters_off",
    none: every adapter is zeroed, so the reference is the frozen base. Its program builds the
    model exactly as the in-step reference does (`merge` in the training precision, then
    `hone.train.reference.reference_model`), in chunks of one micro-batch, so the
    log-probabilities and the memory match the reference inside the step.
    """

    KEYS = ("tokens", "positions", "attention_mask", "targets")  # what its forward reads
    TREE_KEYS = ("tokens", "positions", "attention_mask", "segment_ids", "branch_ids",
                 "score_index", "score_targets")  # ... from tree rows

    def __init__(self, cfg, graphdef, template, frozen, mode: str, params: dict, devices):
        if mode == "adapters_off":  # no transfer of adapter values the program zeroes anyway
            params = jax.tree.map(jnp.zeros_like, params)
        self.template = template
        precision, chunks = cfg.train.precision, cfg.train.grad_accum

        def ref_logp(weights, batch):
            flat = flatten(weights["params"])

            def score(mb):
                model = merge(graphdef, template, flat, weights["frozen"], precision)
                ref = reference_model(model, mode, flat)
                if "branch_ids" in mb:
                    return branch_logprobs(ref, mb)[0]  # [groups, G, M]
                return row_logprobs(ref, mb)[0]  # [b, L]

            return chunked(score, batch, chunks)

        weights = {"params": unflatten(template, params), "frozen": frozen}
        super().__init__(weights, {"ref_logp": ref_logp}, devices)

    def transfer_params(self, params: dict) -> None:
        """New reference values of the trainable weights (flat), device to device."""
        self.transfer("params", unflatten(self.template, params))

    def __call__(self, rows: dict) -> np.ndarray:
        keys = self.TREE_KEYS if "branch_ids" in rows else self.KEYS + tuple(
            k for k in ("segment_ids",) if k in rows)  # episode rows: packed segments
        return super().__call__({key: rows[key] for key in keys})

    def describe(self) -> str:
        per_device = self.layout.device_bytes(self.weights, self.devices[-1])
        return (f"on devices {[d.id for d in self.devices]} "
                f"({per_device / 2**20:.1f} MiB of weights on each)")
