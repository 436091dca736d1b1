"""What every training recipe does the same way: open the run folder, read preference pairs,
build the jitted train and eval steps, and sum evaluation metrics over held-out batches."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from hone.config import dump_yaml
from hone.errors import InputError
from hone.parallel import Layout, logical_names
from hone.train.oom import AccumStep
from hone.train.optimizer import build_optimizer
from hone.train.state import flatten, new_train_state, split_model
from hone.train.step import make_eval_step, make_train_step, row_split


def branch_hidden(model, mb):
    """Rows of one shared prompt and several answers (`hone.data.shared_prefix`): one forward
    pass of `model` (a Transformer) over each row; its hidden states [N, A·K, D] at the slots
    that predict answer tokens (score_index [N, A, K])."""
    hidden = model.hidden(mb["tokens"], positions=mb["positions"],
                          attention_mask=mb["attention_mask"], segment_ids=mb["segment_ids"],
                          branch_ids=mb["branch_ids"])                        # [N, S, D]
    n, answers, width = mb["score_index"].shape
    return jnp.take_along_axis(hidden, mb["score_index"].reshape(n, answers * width, 1), axis=1)


def branch_logprobs(model, mb):
    """The LM head on `branch_hidden` only: the logits [N, A·K, V] of the slots that predict
    answer tokens and the log-probabilities [N, A, K] of the answer tokens (score_targets;
    0-masked by score_mask where there is none)."""
    from hone.losses import token_logprobs
    n, answers, width = mb["score_index"].shape
    logits = model.logits_from_hidden(branch_hidden(model, mb))
    targets = mb["score_targets"].reshape(n, answers * width)
    return logits, token_logprobs(logits, targets).reshape(n, answers, width)


def open_run(cfg) -> Path:
    """The run folder with the resolved config written into it (after all input was checked)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:  # one writer; the other processes hold the same config
        from hone.checkpoint import ensure_unlocked
        ensure_unlocked(run_dir / "checkpoints")  # a run already using run_dir: refuse now
        dump_yaml(cfg, run_dir / "config.yaml")
    return run_dir


def load_pairs(cfg, tokenizer, log, shared_prompt: bool = False):
    """(training pairs, held-out pairs or None) for a preference config."""
    from hone.data.preference import PreferenceData
    d = cfg.data
    kw = dict(max_length=d.max_length, overlong=d.overlong, max_records=d.max_records,
              batch_size=cfg.train.batch_size, seed=cfg.train.seed, shared_prompt=shared_prompt)
    train = PreferenceData(d.path, tokenizer, **kw)
    log(f"data: {train.describe()}")
    held_out = PreferenceData(d.eval_path, tokenizer, **kw) if d.eval_path else None
    if held_out is not None:
        log(f"eval data: {held_out.describe()}")
    return train, held_out


def make_layout(cfg, rows_per_example: int = 1, devices=None) -> Layout:
    """The run's Layout (cfg.mesh over `devices`, default all), its batch checked against it."""
    layout = Layout.from_config(cfg, devices)
    check_layout(cfg, layout, rows_per_example)
    return layout


def check_layout(cfg, layout: Layout, rows_per_example: int = 1) -> None:
    """The batch must split over the mesh: rows over data x fsdp, and in the all-reduce mode
    each device's rows into grad_accum micro-batches."""
    t = cfg.train
    what = "rows" if rows_per_example == 1 else "pairs"
    layout.check_rows(t.batch_size, "train.batch_size", what)
    if layout.mode == "allreduce" and (t.batch_size // layout.shards) % t.grad_accum:
        raise InputError(f"{t.batch_size // layout.shards} {what} per device do not split "
                         f"into train.grad_accum = {t.grad_accum} micro-batches",
                         key="train.grad_accum")


def compile_steps(cfg, model: nnx.Module, trainable, loss_fn, normalizer_fn, *,
                  split=row_split, layout: Layout | None = None):
    """(graphdef, params template, frozen rest, fresh train state, train step, eval step).

    The model is placed on the mesh of cfg.mesh (or `layout`) first, so the frozen rest, the
    parameters and the optimizer state are all sharded by their logical names."""
    layout = layout or make_layout(cfg)
    layout.place_model(model)
    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = build_optimizer(cfg.train)
    state = new_train_state(flatten(params), optimizer, cfg.train.seed)
    state = layout.place_train_state(state, logical_names(params))
    # Rebuilt with more accumulation when the step runs out of memory (hone.train.oom).
    step = AccumStep(lambda accum: make_train_step(
        graphdef, params, loss_fn, normalizer_fn, optimizer, schedule, accum=accum,
        precision=cfg.train.precision, split=split, layout=layout),
        cfg.train.grad_accum, cfg.train.batch_size, layout.shards)
    eval_step = make_eval_step(graphdef, params, loss_fn, precision=cfg.train.precision)
    return graphdef, params, frozen, state, step, eval_step


def summed_eval(eval_step, frozen, data, means: Callable[[dict], dict], aux=None,
                place=lambda batch: batch):
    """params -> means(sums of every metric over the held-out batches, keys prefixed eval_)."""

    def evaluate(params) -> dict:
        total: dict[str, float] = {}
        for batch in map(place, data.batches()):
            for k, v in jax.device_get(eval_step(params, frozen, batch, aux)).items():
                total["eval_" + k] = total.get("eval_" + k, 0.0) + float(v)
        return means(total)

    return evaluate
