"""The training recipes, one per command; `recipe(command)` imports only the one asked for."""

from __future__ import annotations

import importlib
from typing import Callable

_RECIPES = {"sft": "hone.recipes.sft:run_sft", "dpo": "hone.recipes.dpo:run_dpo",
            "reward": "hone.recipes.reward:run_reward", "grpo": "hone.recipes.grpo:run_grpo",
            "ppo": "hone.recipes.ppo:run_ppo", "distill": "hone.recipes.distill:run_distill",
            "kto": "hone.recipes.kto:run_kto"}


def recipe(command: str) -> Callable:
    """`run_<command>(cfg, *, log)` of a training command (sft, dpo, kto, reward, grpo,
    ppo, distill)."""
    module, name = _RECIPES[command].split(":")
    return getattr(importlib.import_module(module), name)
