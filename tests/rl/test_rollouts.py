"""One rollout protocol (hone/rl/rollouts.py): the RL recipes take their rollouts from
`make_rollouts` and never branch on whether they are episodes; both kinds answer the same calls."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from hone.config import GRPOConfig, PPOConfig, load_config
from hone.rl.collect import Rollouts
from hone.rl.episode_collect import AgentRollouts
from hone.rl.rollout import tree_layout
from hone.rl.rollouts import make_rollouts

ROOT = Path(__file__).resolve().parents[2]
RECIPES = ("grpo", "ppo", "online_dpo")
AGENT = ["agent.environment=hone.agents.tasks:GuessNumber", "agent.max_turns=3",
         "agent.max_episode_tokens=416"]


def test_no_rl_recipe_reads_the_agent_section():
    for name in RECIPES:
        tree = ast.parse((ROOT / "hone/recipes" / f"{name}.py").read_text())
        reads = [node.lineno for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and node.attr == "agent"]
        assert not reads, f"hone/recipes/{name}.py reads .agent on lines {reads}"


def test_both_kinds_answer_the_same_calls():
    for method in ("describe", "policy", "collect", "evaluator"):
        mine = inspect.signature(getattr(Rollouts, method)).parameters
        theirs = inspect.signature(getattr(AgentRollouts, method)).parameters
        assert list(mine) == list(theirs), method


def test_the_config_picks_the_kind_and_episodes_are_never_tree_rows():
    for config in (GRPOConfig, PPOConfig):
        section = config.SECTION
        plain = load_config(config, str(ROOT / f"configs/tiny/{section}.yaml"), [
            f"{section}.shared_prompt=true"])
        agent = load_config(config, str(ROOT / f"configs/tiny/{section}.yaml"), [
            f"{section}.shared_prompt=true", *AGENT])
        s = getattr(plain, section)
        built = make_rollouts(plain, s, None, None, None, None, None, None, None,
                              tree=tree_layout(plain))
        assert isinstance(built, Rollouts) and built.describe().startswith("one per prompt")
        s = getattr(agent, section)
        assert not tree_layout(agent)
        built = make_rollouts(agent, s, None, None, None, None, None, None, None,
                              tree=tree_layout(agent), turn_gamma=0.5)
        assert isinstance(built, AgentRollouts) and built.turn_gamma == 0.5
        assert built.describe() == "one per episode (episodes of up to 3 turns)"


def test_auto_engine_is_paged_on_a_cpu_and_static_on_an_accelerator(monkeypatch):
    from hone.sampling import paged
    assert paged.rollout_engine("auto") == "paged"  # the tests run on a CPU
    assert paged.rollout_engine("static") == "static"
    monkeypatch.setattr(paged.jax, "default_backend", lambda: "tpu")
    assert paged.rollout_engine("auto") == "static"
    assert paged.rollout_engine("paged") == "paged"
