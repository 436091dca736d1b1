"""A reward model: the transformer backbone plus a scalar head read at the last real token.

The layout is the one Hugging Face's `*ForSequenceClassification` (num_labels=1) uses: the
final-normed hidden state of the last non-padding token times a [D, 1] `score` matrix, no bias.
So a trained reward model exports as a folder transformers loads with
AutoModelForSequenceClassification, and hone loads it back with `load_reward_model`.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from safetensors.numpy import save_file

from hone.errors import InputError
from hone.models.linear import Linear
from hone.models.transformer import Transformer

_CLASSIFIERS = {"llama": "LlamaForSequenceClassification",
                "qwen2": "Qwen2ForSequenceClassification",
                "qwen3": "Qwen3ForSequenceClassification",
                "gemma": "GemmaForSequenceClassification",
                "gemma2": "Gemma2ForSequenceClassification",
                "gemma3_text": "Gemma3TextForSequenceClassification"}
HEAD_FILE = "model-score.safetensors"  # the head, listed in the index beside the backbone
BACKBONE_FILE = "model-backbone.safetensors"


class RewardModel(nnx.Module):
    """tokens [B, T] -> rewards [B] (float32)."""

    def __init__(self, backbone: Transformer, *, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.backbone = backbone
        self.config = backbone.config
        dtype = backbone.embedder.embedding[...].dtype
        self.head = Linear((self.config.hidden_size,), (1,), ("embed", "score"), dtype, rngs)

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None,
                 segment_ids: jax.Array | None = None) -> jax.Array:
        hidden = self.backbone.hidden(tokens, positions, attention_mask, segment_ids)
        b, t = tokens.shape
        valid = (jnp.ones((b, t), jnp.bool_) if attention_mask is None
                 else attention_mask.astype(jnp.bool_))
        # The rightmost real token (padding may sit on either side).
        last = jnp.max(jnp.where(valid, jnp.arange(t)[None, :], 0), axis=1)
        picked = hidden[jnp.arange(b), last]  # [B, D]
        return self.head(picked)[:, 0].astype(jnp.float32)

    def branch_rewards(self, tokens: jax.Array, positions: jax.Array, attention_mask: jax.Array,
                       segment_ids: jax.Array, branch_ids: jax.Array,
                       branches: int = 2) -> jax.Array:
        """Rewards [B, branches] of rows holding one shared prompt and several answers
        (`hone.data.shared_prefix`; branch_ids 1..branches): each read at its answer's last
        token, which sees the prompt and that answer only, so it equals the reward of the
        prompt + answer row alone."""
        hidden = self.backbone.hidden(tokens, positions, attention_mask, segment_ids,
                                      branch_ids=branch_ids)
        b, t = tokens.shape
        slots = jnp.arange(t)[None, None, :]
        mine = ((branch_ids[:, None, :] == jnp.arange(1, branches + 1)[None, :, None])
                & attention_mask.astype(jnp.bool_)[:, None, :])   # [B, branches, T]
        last = jnp.max(jnp.where(mine, slots, 0), axis=2)        # [B, branches]
        picked = jnp.take_along_axis(hidden, last[..., None], axis=1)  # [B, branches, D]
        return self.head(picked)[..., 0].astype(jnp.float32)


def save_reward_model(model: RewardModel, out_dir: str | Path, tokenizer=None) -> Path:
    """A Hugging Face sequence-classification folder (num_labels=1) that transformers loads."""
    from hone.models.hf import save_hf
    out = save_hf(model.backbone, out_dir, tokenizer)
    config = json.loads((out / "config.json").read_text())
    config.update(architectures=[_CLASSIFIERS[model.config.family]], num_labels=1,
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
    from safetensors import safe_open
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
    from hone.models.hf import SafetensorsFolder, load_hf
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
