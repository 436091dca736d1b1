"""`hone sft`: supervised fine-tuning (full, LoRA or QLoRA) wired from a config.

Order matters for "bad input loses nothing": the config, tokenizer and every data record are
checked before the run folder gets a checkpoint, so an error leaves an earlier run untouched.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.config import SFTConfig, dump_yaml
from hone.losses import sft_loss
from hone.models.loading import load_model, load_tokenizer
from hone.train.loop import LoopSpec, run_loop
from hone.train.optimizer import build_optimizer
from hone.train.state import flatten, new_train_state, split_model, unflatten
from hone.train.step import make_eval_step, make_train_step


def sft_step_loss(model, mb, normalizer, key, aux=None):
    """Masked next-token NLL of one micro-batch (packed rows attend within their documents)."""
    logits = model(mb["tokens"], positions=mb["positions"], attention_mask=mb["attention_mask"],
                   segment_ids=mb["segment_ids"])
    return sft_loss(logits, mb["targets"], mb["loss_mask"], normalizer)


def target_tokens(batch) -> jax.Array:
    return jnp.maximum(jnp.sum(batch["loss_mask"]), 1.0)


def build_model(cfg, *, log=print):
    """The model to train, with adapters when model.lora.rank > 0; and its trainable filter."""
    from hone.models.lora import LoRAParam, apply_lora
    model = load_model(cfg.model.source, dtype=cfg.model.dtype)
    lora = cfg.model.lora
    trainable = nnx.Param
    if lora.rank > 0:
        apply_lora(model, rank=lora.rank, alpha=lora.alpha, targets=lora.targets,
                   dropout=lora.dropout, quantize=lora.quantize, rngs=nnx.Rngs(cfg.train.seed))
        trainable = LoRAParam
    model.remat = cfg.train.remat
    return model, trainable


def make_eval_fn(eval_step, frozen, eval_data):
    """params -> {"eval_loss", "eval_ppl"} over the held-out batches (token-weighted)."""

    def evaluate(params):
        nll, tokens = 0.0, 0.0
        for batch in eval_data.batches():
            m = jax.device_get(eval_step(params, frozen, batch))
            nll += float(m["nll_sum"])
            tokens += float(m["target_tokens"])
        loss = nll / max(tokens, 1.0)
        return {"eval_loss": loss, "eval_ppl": float(np.exp(min(loss, 50.0)))}

    return evaluate


def run_sft(cfg: SFTConfig, *, log=print):
    """Train per cfg; returns (trained model, final train state)."""
    from hone.data.loader import SFTData
    run_dir = Path(cfg.run_dir)
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
    model, trainable = build_model(cfg)
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_yaml(cfg, run_dir / "config.yaml")

    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = build_optimizer(cfg.train)
    state = new_train_state(flatten(params), optimizer, cfg.train.seed)
    step = make_train_step(graphdef, params, sft_step_loss, target_tokens, optimizer, schedule,
                           accum=cfg.train.grad_accum, precision=cfg.train.precision)
    eval_fn = None
    if eval_data is not None:
        eval_step = make_eval_step(graphdef, params, sft_step_loss, precision=cfg.train.precision)
        eval_fn = make_eval_fn(eval_step, frozen, eval_data)
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, data=train_data.iterator(),
        eval_fn=eval_fn,
        tokens_per_batch=lambda b: int(np.sum(b["attention_mask"])),
        flops_per_token=model.config.flops_per_token(d.max_length))
    final = run_loop(spec, cfg, run_dir)
    trained = nnx.merge(graphdef, unflatten(params, final["params"]), frozen)
    return trained, final
