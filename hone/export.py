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
    import yaml
    from flax import nnx

    from hone.checkpoint import Checkpointer
    from hone.config import COMMANDS, load_config
    from hone.tokenizer import load_tokenizer
    from hone.train.build import build_model, build_reward_model
    from hone.train.state import split_model, unflatten

    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").exists():
        raise InputError("not a run folder (no config.yaml)", path=str(run_dir))
    # The command's own section (dpo:, reward:, grpo:, ppo:, distill:) tells which config
    # class wrote it.
    sections = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    command = next((c for c in COMMANDS if c != "sft" and c in sections), "sft")
    cfg = load_config(COMMANDS[command], str(run_dir / "config.yaml"))
    ckpt = Checkpointer(run_dir / "checkpoints", keep=cfg.checkpoint.keep, async_save=False)
    try:
        if ckpt.latest_step() is None:
            raise InputError("the run has no checkpoint yet", path=str(run_dir / "checkpoints"))
        state, _ = ckpt.read()
    finally:
        ckpt.close()
    if command == "ppo":  # the policy of the actor-critic (the critic stays in the run)
        from hone.rl.critic import build_ppo_model
        model, trainable, _ = build_ppo_model(cfg)
    elif command == "distill":  # the student (its feature projections stay in the run)
        from hone.distill.student import build_student, teacher_width
        model, trainable = build_student(cfg, teacher_width(cfg))
    else:
        model, trainable = (build_reward_model if command == "reward" else build_model)(cfg)
    graphdef, params, frozen = split_model(model, trainable)
    model = nnx.merge(graphdef, unflatten(params, state["params"]), frozen)
    if command == "ppo":
        model = model.policy
    elif command == "distill":
        model = model.model
    return model, load_tokenizer(cfg.model.source), cfg


def export_run(run_dir: str | Path, out_dir: str | Path, fmt: str = "hf") -> Path:
    from hone.weights.hf import save_hf
    from hone.models.lora import expert_lora_modules, lora_modules, merge_lora
    from hone.weights.peft import save_peft
    from hone.models.reward import RewardModel
    from hone.weights.hf_reward import save_reward_model

    model, tokenizer, cfg = load_run_model(run_dir)
    has_adapters = bool(lora_modules(model) or expert_lora_modules(model))
    if isinstance(model, RewardModel):
        if fmt != "hf":
            raise InputError("a reward model exports as a Hugging Face sequence-classification "
                             "folder only; use --format hf", key="--format")
        if has_adapters:
            model.backbone = merge_lora(model.backbone)
        return save_reward_model(model, out_dir, tokenizer)
    if fmt == "hf":
        return save_hf(merge_lora(model) if has_adapters else model, out_dir, tokenizer)
    if fmt == "peft":
        if not has_adapters:
            raise InputError("a PEFT export needs a run trained with adapters "
                             "(model.lora.rank > 0); use --format hf", key="--format")
        return save_peft(model, out_dir, base_model_name_or_path=cfg.model.source)
    raise InputError(f"unknown format {fmt!r}; allowed: hf, peft", key="--format")
