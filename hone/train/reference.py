"""The frozen reference model of DPO, KTO, GRPO and PPO: which one a config asks for, and the one
builder every path uses (DPO's loss, the RL steps' scoring, a reference on devices of its own).

Modes and their single rule:
- "adapters_off": the frozen base, i.e. the model with EVERY LoRA adapter zeroed, not only the
  trainable ones. With `model.train_layers` only the top blocks' adapters train; the lower
  blocks' adapters are then part of neither the policy's updates nor the base, and zeroing just
  the trainable subset would leave them in the reference whenever they are not zero.
- "copy" (and PPO's "ema"): the model with its trained weights replaced by the values given
  (the starting values, or their moving average), flat "/"-keyed like the train state's
  params; every other weight is shared with the policy as it is.
- None: the loss reads no reference (DPO's SimPO and ORPO, GRPO with beta 0, PPO without a KL
  term), so none is built or run. "precomputed" (DPO) scores the pairs once, up front, with the
  "adapters_off" model (LoRA) or the starting model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Iterable

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.train.state import flatten, unflatten

# DPO-family losses that compare the policy with nothing but itself.
REFERENCE_FREE = ("simpo", "orpo")

# Whether a command's loss reads a reference, from its section of the config.
_NEEDED = {
    "dpo": lambda s: s.loss_type not in REFERENCE_FREE,
    "grpo": lambda s: s.beta > 0,
    "ppo": lambda s: s.kl_coef > 0 or s.kl_target is not None,
    "kto": lambda s: True,
}


def reference_mode(cfg) -> str | None:
    """The reference a DPO, KTO, GRPO or PPO config asks for: its section's `reference`, with "auto"
    resolved (adapters_off with LoRA, else copy); None when its loss needs no reference."""
    name = next(n for n in _NEEDED if hasattr(cfg, n))
    section = getattr(cfg, name)
    if not _NEEDED[name](section):
        return None
    if section.reference == "auto":
        return "adapters_off" if cfg.model.lora.rank > 0 else "copy"
    return section.reference


def reference_model(model: nnx.Module, mode: str, params: dict | None = None) -> nnx.Module:
    """The reference for `mode` (module docstring), sharing structure and every weight it does
    not replace with `model`. `params`: the reference's values of the trained weights (flat,
    keyed relative to `model`) for "copy" and "ema"; ignored for "adapters_off"."""
    if mode == "adapters_off":
        from hone.models.lora import LoRAParam
        graphdef, lora, rest = nnx.split(model, LoRAParam, ...)
        return nnx.merge(graphdef, jax.tree.map(jnp.zeros_like, lora), rest)
    if params is None:
        raise ValueError(f"reference_model: mode {mode!r} needs the reference's weights")
    graphdef, state, rest = nnx.split(model, nnx.Param, ...)
    return nnx.merge(graphdef, unflatten(state, {**flatten(state), **params}), rest)


def cached_halves(cache: Path, fingerprint: str, score: Callable, batches: Iterable, n: int,
                  names: tuple[str, str]) -> tuple[dict[str, np.ndarray], bool]:
    """A "precomputed" reference's log-probs of n examples of two rows each (DPO: chosen and
    rejected; KTO: the example and its KL row): `score(batch)` gives [2B], the batch's first
    rows then their second. Read from `cache` when its fingerprint matches, else computed over
    `batches` and written atomically. Returns ({names[0]: [n], names[1]: [n]}, reused)."""
    if cache.exists():
        saved = np.load(cache)
        if str(saved["fingerprint"]) == fingerprint:
            return {k: saved[k] for k in names}, True
    first, second = [], []
    for batch in batches:
        seq = np.asarray(score(batch))  # [2B]
        first.append(seq[:len(seq) // 2])
        second.append(seq[len(seq) // 2:])
    out = {names[0]: np.concatenate(first)[:n].astype(np.float32),
           names[1]: np.concatenate(second)[:n].astype(np.float32)}
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp.npz")
    np.savez(tmp, fingerprint=np.array(fingerprint), **out)
    tmp.replace(cache)
    return out, False
