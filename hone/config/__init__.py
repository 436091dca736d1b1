"""Typed configuration of the training commands: YAML files and dotted overrides -> dataclasses."""

from hone.config.fields import check_fields
from hone.config.loader import load_config
from hone.config.schema import (CheckpointSection, DataSection, LogSection, LoraSection,
                                MeshSection, ModelSection, SFTConfig, TrainConfig, TrainSection)
from hone.config.yaml_io import dump_yaml, to_dict

__all__ = ["CheckpointSection", "DataSection", "LogSection", "LoraSection", "MeshSection",
           "ModelSection", "SFTConfig", "TrainConfig", "TrainSection", "check_fields",
           "dump_yaml", "load_config", "to_dict"]
