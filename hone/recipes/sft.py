"""`hone sft`: supervised fine-tuning (full, LoRA or QLoRA) wired from a config.

Order matters for "bad input loses nothing": the config, tokenizer and every data record are
checked before the run folder gets a checkpoint, so an error leaves an earlier run untouched.
"""

from __future__ import annotations

from flax import nnx

from hone.config import SFTConfig
from hone.data.shared_prefix import work_tokens
from hone.errors import InputError
from hone.tokenizer import load_tokenizer
from hone.train.build import build_model, compile_steps, make_layout, open_run, summed_eval
from hone.train.loop import LoopSpec, run_loop
from hone.train.sft_objective import sft_eval_means, sft_step_loss, target_tokens
from hone.train.state import unflatten
from hone.weights.hf_vision import vision_family


def run_sft(cfg: SFTConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state)."""
    tokenizer = load_tokenizer(cfg.model.source)
    train_data, eval_data = _data(cfg, tokenizer)
    log(f"data: {train_data.describe()}")
    if eval_data is not None:
        log(f"eval data: {eval_data.describe()}")
    d = cfg.data
    layout = make_layout(cfg)
    model, trainable = build_model(cfg, layout=layout)
    run_dir = open_run(cfg)
    graphdef, params, frozen, state, step, eval_step = compile_steps(
        cfg, model, trainable, sft_step_loss, target_tokens, layout=layout)
    eval_fn = None
    if eval_data:
        eval_fn = summed_eval(eval_step, frozen, eval_data, sft_eval_means,
                              place=layout.place_batch,
                              max_batches=cfg.train.eval_batches)
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, data=train_data.iterator(),
        eval_fn=eval_fn, place_batch=layout.place_batch,
        tokens_per_batch=work_tokens,
        flops_per_token=getattr(model, "text", model).config.flops_per_token(d.max_length))
    final = run_loop(spec, cfg, run_dir)
    trained = nnx.merge(graphdef, unflatten(params, final["params"]), frozen)
    return trained, final


def _data(cfg: SFTConfig, tokenizer):
    """(training data, evaluation data or None): SFTData, or VisionSFTData for a
    vision-language model (records with images; hone/data/vision.py)."""
    d, t = cfg.data, cfg.train
    family = vision_family(cfg.model.source)
    if family is None:
        from hone.data.loader import SFTData
        kw = dict(tokenizer=tokenizer, format=d.format, max_length=d.max_length, pack=d.pack,
                  loss_on=d.loss_on, overlong=d.overlong, max_records=d.max_records,
                  batch_size=t.batch_size, seed=t.seed)
        return SFTData(d.path, **kw), SFTData(d.eval_path, **kw) if d.eval_path else None
    from hone.data.vision_loader import VisionSFTData, image_settings
    if family != "idefics3":
        raise InputError(f"training on images is built for Idefics3 / SmolVLM so far; this "
                         f"model is {family}", path=cfg.model.source, key="model.source")
    if d.pack:
        raise InputError("records with images are not packed (a row's frames fill its "
                         "placeholders); set data.pack: false", key="data.pack")
    if d.format not in ("auto", "messages"):
        raise InputError(f"a vision-language model trains on messages records (image parts "
                         f"and images); got data.format {d.format!r}", key="data.format")
    kw = dict(tokenizer=tokenizer, settings=image_settings(cfg.model.source),
              max_length=d.max_length, loss_on=d.loss_on, overlong=d.overlong,
              max_records=d.max_records, batch_size=t.batch_size, seed=t.seed)
    train = VisionSFTData(d.path, **kw)
    return train, (VisionSFTData(d.eval_path, max_frames=train.frames, **kw)
                   if d.eval_path else None)
