"""The reward functions of an RL config: its `rewards:` section -> weighted specs ->
`hone.rl.rewards.build_rewards`, checked against the columns the prompts carry."""

from __future__ import annotations

from hone.errors import InputError
from hone.rl.prompts import PromptData


def make_rewards(cfg, section, prompts: PromptData, log):
    """The config's reward functions, checked against the columns the prompts carry."""
    from hone.rl.rewards import build_rewards
    specs = reward_specs(cfg.rewards, section.max_new_tokens)
    if not specs:
        raise InputError("every reward weight is 0: there is nothing to learn from",
                         key="rewards")
    rewards = build_rewards(specs, timeout_s=cfg.rewards.timeout_s,
                            fallback=cfg.rewards.fallback, log=log)
    rewards.check_columns(list(prompts.columns))
    return rewards


def reward_specs(section, max_new_tokens: int) -> list[dict]:
    """The weighted reward-function specs (`hone.rl.rewards.build_rewards`) of a `rewards:`
    section."""
    r = section
    specs: list[dict] = []
    if r.answer_match:
        specs.append({"name": "answer_match", "weight": r.answer_match,
                      "column": r.answer_column})
    if r.format:
        specs.append({"name": "format", "weight": r.format, "pattern": r.format_pattern})
    if r.length:
        specs.append({"name": "length", "weight": r.length, "target_tokens": r.length_target,
                      "per_token": -0.01})
    if r.overlong:
        specs.append({"name": "overlong", "weight": r.overlong, "max_tokens": max_new_tokens,
                      "cache_tokens": r.overlong_cache})
    if r.reward_model:
        specs.append({"name": "reward_model", "weight": r.reward_model_weight,
                      "path": r.reward_model})
    weights = r.function_weights or (1.0,) * len(r.functions)
    for fn, w in zip(r.functions, weights):
        specs.append({"name": fn, "weight": w})
    return specs
