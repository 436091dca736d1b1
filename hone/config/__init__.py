"""Typed configuration of the training commands: YAML files and dotted overrides -> dataclasses."""

from hone.config.distill_schema import DistillConfig, DistillSection, TeacherSection
from hone.config.dpo_schema import DPOConfig, DPOSection
from hone.config.fields import check_fields
from hone.config.kto_schema import KTOConfig, KTODataSection, KTOSection
from hone.config.load import load_config
from hone.config.rl_schema import GRPOConfig, GRPOSection, PPOConfig, PPOSection, RewardsSection
from hone.config.schema import (CheckpointSection, DataSection, DistributedSection,
                                GuardSection, LogSection, LoraSection, MeshSection,
                                ModelSection, MoeSection,
                                RewardConfig, RewardSection, SFTConfig, TrainConfig,
                                TrainSection)
from hone.config.yaml_io import dump_yaml, to_dict

# The config class of each training command (also used to read a run folder's config.yaml).
COMMANDS = {"sft": SFTConfig, "dpo": DPOConfig, "reward": RewardConfig, "grpo": GRPOConfig,
            "ppo": PPOConfig, "distill": DistillConfig, "kto": KTOConfig}

__all__ = ["COMMANDS", "CheckpointSection", "DataSection", "DistillConfig", "DistillSection",
           "TeacherSection", "DPOConfig", "DPOSection",
           "GRPOConfig", "GRPOSection", "GuardSection", "KTOConfig", "KTODataSection", "KTOSection",
           "PPOConfig", "PPOSection", "RewardsSection",
           "LogSection", "LoraSection", "MeshSection", "DistributedSection", "ModelSection",
           "MoeSection", "RewardConfig",
           "RewardSection", "SFTConfig", "TrainConfig", "TrainSection", "check_fields",
           "dump_yaml", "load_config", "to_dict"]
