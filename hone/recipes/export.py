"""`hone export`: a finished (or running) run folder -> a Hugging Face folder or a PEFT adapter.

The run's resolved config.yaml says how to rebuild the model (source, adapters); the newest
checkpoint supplies the trained parameters. A Hugging Face export of an adapter run merges the
adapters into the base weights (dequantizing a QLoRA base).
"""

from __future__ import annotations

from pathlib import Path

from hone.errors import InputError


def load_run_model(run_dir: str | Path):
    """(trained model, tokenizer, config) from a run folder."""
    from hone.checkpoint import Checkpointer
    from hone.config import SFTConfig, load_config
    from hone.models.loading import load_tokenizer
    from hone.recipes.sft import build_model
    from hone.train.state import split_model, unflatten
    from flax import nnx

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise InputError("not a run folder (no config.yaml)", path=str(run_dir))
    cfg = load_config(SFTConfig, str(run_dir / "config.yaml"))
    ckpt = Checkpointer(run_dir / "checkpoints", keep=cfg.checkpoint.keep, async_save=False)
    try:
        if ckpt.latest_step() is None:
            raise InputError("the run has no checkpoint yet", path=str(run_dir / "checkpoints"))
        state, _ = ckpt.read()
    finally:
        ckpt.close()
    model, trainable = build_model(cfg)
    graphdef, params, frozen = split_model(model, trainable)
    model = nnx.merge(graphdef, unflatten(params, state["params"]), frozen)
    return model, load_tokenizer(cfg.model.source), cfg


def export_run(run_dir: str | Path, out_dir: str | Path, fmt: str = "hf") -> Path:
    from hone.models.hf import save_hf
    from hone.models.lora import lora_modules, merge_lora
    from hone.models.peft import save_peft

    model, tokenizer, cfg = load_run_model(run_dir)
    has_adapters = bool(lora_modules(model))
    if fmt == "hf":
        return save_hf(merge_lora(model) if has_adapters else model, out_dir, tokenizer)
    if fmt == "peft":
        if not has_adapters:
            raise InputError("a PEFT export needs a run trained with adapters "
                             "(model.lora.rank > 0); use --format hf", key="--format")
        return save_peft(model, out_dir, base_model_name_or_path=cfg.model.source)
    raise InputError(f"unknown format {fmt!r}; allowed: hf, peft", key="--format")
