"""The training recipes, one per command; `recipe(command)` imports only the one asked for."""

from __future__ import annotations

import importlib
from typing import Callable

_RECIPES = {"sft": "hone.recipes.sft:run_sft", "dpo": "hone.recipes.dpo:run_dpo",
            "reward": "hone.recipes.reward:run_reward", "grpo": "hone.recipes.grpo:run_grpo",
            "ppo": "hone.recipes.ppo:run_ppo", "distill": "hone.recipes.distill:run_distill",
            "kto": "hone.recipes.kto:run_kto"}
# Commands whose config picks another recipe: command -> (test of the config, that recipe).
# `hone dpo` with dpo.online samples and judges its pairs each step (hone/recipes/online_dpo.py).
_VARIANTS = {"dpo": (lambda cfg: cfg.dpo.online, "hone.recipes.online_dpo:run_online_dpo")}


def _load(target: str) -> Callable:
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def recipe(command: str) -> Callable:
    """`run_<command>(cfg, *, log)` of a training command (sft, dpo, kto, reward, grpo,
    ppo, distill); for dpo, the offline or the online recipe, as the config says."""
    if command not in _VARIANTS:
        return _load(_RECIPES[command])
    test, other = _VARIANTS[command]
    return lambda cfg, **kw: _load(other if test(cfg) else _RECIPES[command])(cfg, **kw)
