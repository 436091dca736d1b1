"""`hone sft`: supervised fine-tuning (full, LoRA or QLoRA) wired from a config.

Order matters for "bad input loses nothing": the config, tokenizer and every data record are
checked before the run folder gets a checkpoint, so an error leaves an earlier run untouched.
"""

from __future__ import annotations

from flax import nnx

from hone.config import SFTConfig
from hone.data.shared_prefix import work_tokens
from hone.tokenizer import load_tokenizer
from hone.train.build import build_model, compile_steps, make_layout, open_run, summed_eval
from hone.train.loop import LoopSpec, run_loop
from hone.train.sft_objective import sft_eval_means, sft_step_loss, target_tokens
from hone.train.state import unflatten








def run_sft(cfg: SFTConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state)."""
    from hone.data.loader import SFTData
    tokenizer = load_tokenizer(cfg.model.source)
    d = cfg.data
    data_kw = dict(tokenizer=tokenizer, format=d.format, max_length=d.max_length, pack=d.pack,
                   loss_on=d.loss_on, overlong=d.overlong, max_records=d.max_records)
    train_data = SFTData(d.path, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                         **data_kw)
    log(f"data: {train_data.describe()}")
    eval_data = None
    if d.eval_path:
        eval_data = SFTData(d.eval_path, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
                            **data_kw)
        log(f"eval data: {eval_data.describe()}")
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
        flops_per_token=model.config.flops_per_token(d.max_length))
    final = run_loop(spec, cfg, run_dir)
    trained = nnx.merge(graphdef, unflatten(params, final["params"]), frozen)
    return trained, final
