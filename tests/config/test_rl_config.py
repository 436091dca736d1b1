"""RL configs: every shipped RL config loads, and rules between keys name the key to fix."""

from pathlib import Path

import pytest

from hone.config import GRPOConfig, PPOConfig, load_config
from hone.errors import InputError

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("cls,path", [
    (GRPOConfig, "configs/tiny/grpo.yaml"), (GRPOConfig, "configs/smollm2/grpo_lora.yaml"),
    (PPOConfig, "configs/tiny/ppo.yaml"), (PPOConfig, "configs/smollm2/ppo_lora.yaml"),
    (GRPOConfig, "configs/smollm2/agent_calculator_grpo.yaml"),
    (GRPOConfig, "configs/smollm2/agent_countdown_grpo.yaml")])
def test_shipped_rl_configs_load(cls, path):
    cfg = load_config(cls, str(ROOT / path))
    section = cfg.grpo if cls is GRPOConfig else cfg.ppo
    assert cfg.train.batch_size % section.group_size == 0


@pytest.mark.parametrize("cls,overrides,key", [
    (GRPOConfig, ["train.batch_size=6", "grpo.group_size=4"], "train.batch_size"),
    (GRPOConfig, ["grpo.reference=adapters_off"], "grpo.reference"),
    (GRPOConfig, ["grpo.group_size=1", "train.batch_size=4"], "grpo.group_size"),
    (GRPOConfig, ["rewards.function_weights=[1.0]"], "rewards.function_weights"),
    (PPOConfig, ["train.batch_size=8", "ppo.minibatches=3"], "ppo.minibatches"),
    (PPOConfig, ["grpo.beta=0.1"], "grpo"),
])
def test_rl_config_rules_name_the_key(cls, overrides, key):
    with pytest.raises(InputError, match=key.replace(".", r"\.")):
        load_config(cls, None, overrides)
