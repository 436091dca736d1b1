"""A reward model as a Hugging Face sequence-classification folder (num_labels=1), out and in.

The backbone is written as `save_hf` writes any model; the [1, D] `score` head goes to a file of
its own listed in the index beside it, and config.json names the family's
`*ForSequenceClassification` class, so transformers' AutoModelForSequenceClassification loads
the folder as-is and `load_reward_model` reads it (or one transformers wrote) back.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from hone.errors import InputError
from hone.models.reward import RewardModel
from hone.weights.hf import SafetensorsFolder, load_hf, save_hf

CLASSIFIERS = {"llama": "LlamaForSequenceClassification",
                "qwen2": "Qwen2ForSequenceClassification",
                "qwen3": "Qwen3ForSequenceClassification",
                "gemma": "GemmaForSequenceClassification",
                "gemma2": "Gemma2ForSequenceClassification",
                "gemma3_text": "Gemma3TextForSequenceClassification"}
HEAD_FILE = "model-score.safetensors"  # the head, listed in the index beside the backbone
BACKBONE_FILE = "model-backbone.safetensors"


def save_reward_model(model: RewardModel, out_dir: str | Path, tokenizer=None) -> Path:
    """A Hugging Face sequence-classification folder (num_labels=1) that transformers loads."""
    out = save_hf(model.backbone, out_dir, tokenizer)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=[CLASSIFIERS[model.config.family]], num_labels=1,
                  id2label={"0": "LABEL_0"}, label2id={"LABEL_0": 0})
    if config.get("pad_token_id") is None:  # transformers finds the last token through pad
        config["pad_token_id"] = config.get("eos_token_id")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    score = np.asarray(jax.device_get(model.head.kernel[...])).T.copy()  # [1, D]
    save_file({"score.weight": score}, str(out / HEAD_FILE), metadata={"format": "pt"})
    _index_with_head(out)
    return out


def _index_with_head(out: Path) -> None:
    """List every tensor, the head's too, in model.safetensors.index.json. A single-file
    backbone is renamed: transformers reads `model.safetensors` alone whenever it exists."""
    index_path = out / "model.safetensors.index.json"
    if index_path.exists():
        index = json.loads(index_path.read_text())
    else:
        single = out / "model.safetensors"
        with safe_open(str(single), framework="numpy") as f:
            names = list(f.keys())
        single.rename(out / BACKBONE_FILE)
        index = {"metadata": {}, "weight_map": {n: BACKBONE_FILE for n in names}}
    index["weight_map"]["score.weight"] = HEAD_FILE
    index_path.write_text(json.dumps(index, indent=2))


def load_reward_model(folder: str | Path, dtype=jnp.float32) -> RewardModel:
    """A RewardModel from a folder written by save_reward_model (or transformers)."""
    folder = Path(folder)
    backbone = load_hf(folder, dtype)
    source = SafetensorsFolder(folder)
    if "score.weight" not in source.names():
        raise InputError("no 'score.weight' tensor: not a reward model folder", path=str(folder))
    score = source.get("score.weight")
    if score.shape != (1, backbone.config.hidden_size):
        raise InputError(f"'score.weight' has shape {score.shape}, expected "
                         f"(1, {backbone.config.hidden_size})", path=source.where("score.weight"))
    model = RewardModel(backbone)
    model.head.kernel[...] = jnp.asarray(score.T, dtype)
    return model
