"""Typed configuration of the training commands: YAML files and dotted overrides -> dataclasses."""

from hone.config.loader import check_fields, dump_yaml, load_config, to_dict
from hone.config.schema import (CheckpointSection, DataSection, LogSection, LoraSection,
                                MeshSection, ModelSection, SFTConfig, TrainConfig, TrainSection)

__all__ = ["CheckpointSection", "DataSection", "LogSection", "LoraSection", "MeshSection",
           "ModelSection", "SFTConfig", "TrainConfig", "TrainSection", "check_fields",
           "dump_yaml", "load_config", "to_dict"]
