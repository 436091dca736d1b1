"""`hone export`: a finished (or running) run folder, or any model `load_model` takes -> a Hugging
Face folder, a PEFT adapter or a GGUF file.

The run's resolved config.yaml says how to rebuild the model (source, adapters); the newest
checkpoint supplies the trained parameters. A Hugging Face or GGUF export of an adapter run merges
the adapters into the base weights (dequantizing a QLoRA base). A GGUF file carries the tokenizer:
a model from a GGUF file keeps that file's tokenizer keys, any other is converted, and the
written file's tokenizer must encode probe texts to the same ids as the model's own before the
file takes its name (hone/weights/gguf_write.py writes it whole or not at all).
"""

from __future__ import annotations

from pathlib import Path

from hone.errors import InputError


def load_run_model(run_dir: str | Path, step: int | None = None):
    """(trained model, tokenizer, config) from a run folder: its newest checkpoint, or the one
    of `step` (which the run must have kept: checkpoint.keep)."""
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
        kept = sorted(ckpt.manager.all_steps())
        if step is not None and step not in kept:
            raise InputError(f"the run has no checkpoint of step {step}; it kept "
                             f"{', '.join(map(str, kept))}", path=str(run_dir / "checkpoints"),
                             key="--step")
        state, _ = ckpt.read(step)
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


# Texts whose ids a GGUF export's tokenizer must reproduce: words, digits, contractions, runs of
# spaces and newlines, accents, CJK, an emoji (byte fallback), and each special token.
_PROBES = ("Hello world! It's 2024: 12345 apples, naïve café.\n\n  two  spaces\tand a tab",
           "def f(x):\n    return x ** 2  # 你好 🙂", " leading space", "")
_FORMATS = ("hf", "peft", "gguf")


def _check_tokenizer(tokenizer, written: Path) -> None:
    """Refuse a GGUF file whose tokenizer encodes differently from the model's own."""
    from hone.tokenizer import Tokenizer

    back = Tokenizer.from_gguf(written)
    specials = [t.content for t in tokenizer.backend.get_added_tokens_decoder().values()][:64]
    texts = [*_PROBES, "".join(specials) + " x " + " y ".join(specials)]
    if tokenizer.chat_template is not None:
        texts.append(tokenizer.apply_chat_template(
            [{"role": "user", "content": _PROBES[0]}, {"role": "assistant", "content": "ok"}],
            add_generation_prompt=False))
    for text in texts:
        want, got = tokenizer.encode(text), back.encode(text)
        if want != got:
            raise InputError(f"the tokenizer written to GGUF encodes {text[:40]!r} as "
                             f"{got[:12]} instead of {want[:12]}; this tokenizer cannot be "
                             f"exported to GGUF", key="tokenizer")
    if (back.chat_template, back.bos_id, back.eos_id) != (
            tokenizer.chat_template, tokenizer.bos_id, tokenizer.eos_id):
        raise InputError("the GGUF tokenizer's chat template or BOS/EOS ids differ from the "
                         "model's", key="tokenizer")


def export_gguf(model, tokenizer, out: str | Path, quant: str = "f32",
                source: str | Path | None = None) -> Path:
    """Write `model` (adapters already merged) and its tokenizer as one GGUF file of type
    `quant` (f32, f16, bf16, q8_0, q4_k_m). `source`: where the model came from; a GGUF
    source's tokenizer keys are copied as they are."""
    from hone.weights.gguf_vocab import copy_vocab, vocab_metadata
    from hone.weights.gguf_write import write_gguf
    from hone.weights.hf_vision_save import is_vision_model
    from hone.weights.shipped import SHIPPED_MODELS, shipped_gguf_path

    if is_vision_model(model):
        raise InputError("a vision-language model exports as a Hugging Face folder only; use "
                         "--format hf", key="--format")
    src = None if source is None else str(source)
    if src in SHIPPED_MODELS:
        vocab = copy_vocab(shipped_gguf_path(src))
    elif src is not None and src.endswith(".gguf"):
        vocab = copy_vocab(src)
    else:
        vocab = vocab_metadata(tokenizer, model.config.vocab_size)
    return write_gguf(model, out, quant, vocab,
                      check=lambda written: _check_tokenizer(tokenizer, written))


def export_model(source: str | Path, out: str | Path, fmt: str = "hf",
                 quant: str | None = None) -> Path:
    """Export a model `load_model` takes (a preset, a shipped model, a folder, a .gguf file)."""
    from hone.tokenizer import load_tokenizer
    from hone.weights.hf import save_hf
    from hone.weights.loading import load_model

    _check_format(fmt, quant)
    if fmt == "peft":
        raise InputError("a PEFT export needs a run trained with adapters; give --run",
                         key="--format")
    model, tokenizer = load_model(source), load_tokenizer(source)
    if fmt == "gguf":
        return export_gguf(model, tokenizer, out, quant or "f32", source)
    return save_hf(model, out, tokenizer)


def _check_format(fmt: str, quant: str | None) -> None:
    if fmt not in _FORMATS:
        raise InputError(f"unknown format {fmt!r}; allowed: {', '.join(_FORMATS)}",
                         key="--format")
    if quant is not None and fmt != "gguf":
        raise InputError("--quant applies to --format gguf only", key="--quant")
    if quant is not None:
        from hone.weights.gguf_quant import check_quant
        check_quant(quant)


def export_run(run_dir: str | Path, out_dir: str | Path, fmt: str = "hf",
               quant: str | None = None, step: int | None = None) -> Path:
    from hone.weights.hf import save_hf
    from hone.models.lora import expert_lora_modules, lora_modules, merge_lora
    from hone.weights.peft import save_peft
    from hone.models.reward import RewardModel
    from hone.weights.hf_reward import save_reward_model

    _check_format(fmt, quant)
    model, tokenizer, cfg = load_run_model(run_dir, step)
    has_adapters = bool(lora_modules(model) or expert_lora_modules(model))
    if isinstance(model, RewardModel):
        if fmt != "hf":
            raise InputError("a reward model exports as a Hugging Face sequence-classification "
                             "folder only; use --format hf", key="--format")
        if has_adapters:
            model.backbone = merge_lora(model.backbone)
        return save_reward_model(model, out_dir, tokenizer)
    if fmt == "hf":
        out = save_hf(merge_lora(model) if has_adapters else model, out_dir, tokenizer)
        _copy_processor_files(cfg.model.source, out)
        return out
    if fmt == "gguf":
        return export_gguf(merge_lora(model) if has_adapters else model, tokenizer, out_dir,
                           quant or "f32", cfg.model.source)
    if fmt == "peft":
        if not has_adapters:
            raise InputError("a PEFT export needs a run trained with adapters "
                             "(model.lora.rank > 0); use --format hf", key="--format")
        return save_peft(model, out_dir, base_model_name_or_path=cfg.model.source)
    raise InputError(f"unknown format {fmt!r}; allowed: {', '.join(_FORMATS)}", key="--format")


# A vision-language model's image preprocessing, as transformers' processors read it.
_PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json")


def _copy_processor_files(source: str, out: Path) -> None:
    """The source folder's processor files into the export, so it preprocesses images as the
    run trained on them (nothing for a text model, a preset or a .gguf source)."""
    import shutil
    for name in _PROCESSOR_FILES:
        file = Path(source) / name
        if file.is_file():
            shutil.copyfile(file, Path(out) / name)
