"""Export LoRA adapters as a PEFT adapter folder (adapter_config.json + adapter_model.safetensors).

`peft.PeftModel.from_pretrained(base, folder)` then reproduces the adapted hone model. Module
names come from hone's Hugging Face name table (weights.hf_name_table), so every family exports
without a table of its own: the kernel "model.layers.0.self_attn.q_proj.weight" is the module
"model.layers.0.self_attn.q_proj", whose adapters PEFT stores as
"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" [r, in] and "...lora_B.weight"
[out, r]. hone's A [in_features, r] and B [r, out_features] act on the flattened 2-D kernel,
whose axes flatten in the same (row-major) order as weights.to_hf's, so the HF matrices are
plain transposes. The folder is written to a temporary sibling and renamed when complete.
Routed experts' adapters (lora.ExpertLoRA) are refused: see save_peft's error.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from hone.errors import InputError
from hone.fileio import atomic_folder
from hone.models.lora import expert_lora_modules, lora_modules
from hone.models.transformer import Transformer
from hone.weights.assemble import hf_name_table
from hone.weights.hf_vision_save import is_vision_model, vision_name_table

CONFIG = "adapter_config.json"
WEIGHTS = "adapter_model.safetensors"


def _hf_modules(model: Transformer) -> dict[str, str]:
    """hone module path ("layers/0/attn/q") -> HF module name, for every projection. A
    vision-language model's come from its own table ("text/layers/0/attn/q" ->
    "model.text_model.layers.0.self_attn.q_proj", the tower's and the connector's beside)."""
    table = (vision_name_table(model) if is_vision_model(model)
             else hf_name_table(model.config))
    out = {}
    for path, (name, kind) in table.items():
        if path[-1] == "kernel" and kind in ("in", "out"):
            out["/".join(str(p) for p in path[:-1])] = name.removesuffix(".weight")
    return out


def _target_modules(adapted: list[str], all_modules: list[str]) -> list[str] | str:
    """PEFT's target_modules: leaf names (["q_proj", "v_proj"]) when they select exactly the
    adapted modules, else a regex PEFT fullmatches against module names."""
    leaves = sorted({m.rsplit(".", 1)[-1] for m in adapted})
    selected = {m for m in all_modules if m.rsplit(".", 1)[-1] in leaves}
    if selected == set(adapted):
        return leaves
    return "(" + "|".join(re.escape(m) for m in sorted(adapted)) + ")"


def save_peft(model: Transformer, out_dir: str | Path, base_model_name_or_path: str) -> Path:
    """Write the model's adapters as a PEFT LoRA folder; an existing folder is replaced.

    base_model_name_or_path: recorded in adapter_config.json (the HF model the adapters apply
    to). Adapters keep their dtype. Needs one rank, alpha and dropout across all adapters.
    """
    out_dir = Path(out_dir)
    experts = expert_lora_modules(model)
    if experts:
        raise InputError(
            f"{next(iter(experts))} has expert adapters, which a PEFT folder cannot hold for "
            f"transformers 5: it fuses each layer's experts into the parameters "
            f"experts.gate_up_proj [E, 2F, D] and experts.down_proj, which PEFT 0.21 reaches "
            f"only through target_parameters (one adapter over the fused gate and up, not "
            f"hone's two); export merged with --format hf, or train adapters on attention and "
            f"the shared expert only", key="--format")
    adapted = lora_modules(model)
    if not adapted:
        raise InputError("the model has no LoRA adapters to export (see apply_lora)",
                         key="model.lora")
    settings = {(m.lora.rank, m.lora.alpha, m.lora.dropout_rate) for m in adapted.values()}
    if len(settings) > 1:
        raise InputError(f"adapters differ in (rank, alpha, dropout) {sorted(settings)}; PEFT "
                         f"export needs one setting", key="model.lora")
    (rank, alpha, dropout), = settings
    hf_modules = _hf_modules(model)
    tensors, names = {}, []
    unmapped = [path for path in adapted if path not in hf_modules]
    if unmapped:  # e.g. the vision tower's patch convolution: PEFT's Conv2d adapter differs
        raise InputError(f"{unmapped[0]} has adapters but no PEFT module to put them on; "
                         f"export merged with --format hf, or leave it out of the targets",
                         key="model.lora.targets")
    for path, lin in adapted.items():
        module = hf_modules[path]
        names.append(module)
        prefix = f"base_model.model.{module}"
        a, b = np.asarray(lin.lora.lora_a[...]), np.asarray(lin.lora.lora_b[...])
        tensors[prefix + ".lora_A.weight"] = np.ascontiguousarray(a.T)  # [in, r] -> [r, in]
        tensors[prefix + ".lora_B.weight"] = np.ascontiguousarray(b.T)  # [r, out] -> [out, r]
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base_model_name_or_path,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": dropout,
        "target_modules": _target_modules(names, list(hf_modules.values())),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,  # scale is alpha / r, as in hone
        "use_dora": False,
        "init_lora_weights": True,
        "inference_mode": True,
        "modules_to_save": None,
        "layers_to_transform": None,
    }
    with atomic_folder(out_dir) as tmp:
        save_file(tensors, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / CONFIG).write_text(json.dumps(config, indent=2))
    return out_dir
