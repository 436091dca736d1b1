"""hone plan on a vision-language folder: the language model planned as any text model, plus the
vision tower's and connector's parameters, counted exactly (the parameters of the model hone
loads), trained under full fine-tuning and frozen under model.vision.freeze or LoRA."""

from __future__ import annotations

import json

import jax
import torch
import transformers
from flax import nnx
from vision_reference import idefics3_config

import hone
from hone.cli import main
from hone.plan import PlanInput
from hone.plan.weights import weight_lines


def test_the_tower_is_counted_and_frozen_as_configured(tmp_path, capsys):
    folder = tmp_path / "vlm"
    torch.manual_seed(0)
    transformers.Idefics3ForConditionalGeneration(idefics3_config()).save_pretrained(str(folder))
    model = hone.load_model(folder)
    total = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    text = sum(x.size for x in jax.tree.leaves(nnx.state(model.text, nnx.Param)))

    def plan(*overrides) -> dict:
        assert main(["plan", "--preset", str(folder), "--command", "sft", "--json",
                     *overrides]) == 0
        return json.loads(capsys.readouterr().out)

    full = plan()
    assert full["vision_params"] == total - text > 0
    assert full["persistent"]["parameters (trained)"] == total * 4
    frozen = plan("model.vision.freeze=true")
    assert frozen["persistent"]["parameters (trained)"] == text * 4
    assert frozen["persistent"]["parameters (frozen base)"] == (total - text) * 4
    assert main(["plan", "--preset", str(folder), "--command", "sft"]) == 0
    assert f"+ {(total - text) / 1e6:.2f} M in the vision tower" in capsys.readouterr().out
    lora = weight_lines(PlanInput("sft", model.text.config, lora_rank=4,
                                  vision_params=total - text))
    assert lora["parameters (frozen base)"] == total * 4
