"""What every training command builds the same way from its config: the model to train (with
adapters, the top blocks only, a reward head), the device layout its batch must fit, the run
folder, the jitted train and eval steps, and the held-out evaluation over them.

The recipes (hone/recipes/) wire these pieces per command; they live here, below the recipes,
so that no recipe imports another.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import jax
from flax import nnx

from hone.config import dump_yaml
from hone.config.schema import LoraSection
from hone.errors import InputError
from hone.models.scan_layers import scan_setting
from hone.parallel import Layout, logical_names
from hone.train.oom import AccumStep
from hone.train.optimizer import build_optimizer
from hone.train.state import also_train, new_train_state, split_model, top_blocks, train_params
from hone.train.step import make_eval_step, make_train_step, row_split
from hone.weights.loading import load_model


def build_model(cfg, *, layout=None, log=print):
    """The model to train, with adapters when model.lora.rank > 0; and its trainable filter.
    With a sharded `layout` the base weights are loaded straight onto their shardings."""
    model = load_model(cfg.model.source, dtype=cfg.model.dtype, layout=layout)
    if layout is not None:
        layout.check_experts(model)
    return model, prepare_for_training(model, cfg)


def prepare_for_training(model, cfg):
    """What the config asks of a loaded model before training: LoRA adapters (model.lora), the
    blocks that train (model.train_layers), the router losses and frozen routers of a
    mixture-of-experts model (model.moe), and the static settings of its forward pass
    (train.remat, train.scan_layers, model.attention, train.head_chunk). Returns the trainable
    filter."""
    from hone.models.lora import LoRAParam, apply_lora
    lora = cfg.model.lora
    trainable = nnx.Param
    # A vision-language model: its language model (`text`) is the Transformer the settings and
    # the block selection are about; the default LoRA targets are the language model's.
    text = getattr(model, "text", model)
    if lora.rank > 0:
        targets = lora.targets
        if text is not model and targets == LoraSection.targets:
            targets = "text/" + targets
        apply_lora(model, rank=lora.rank, alpha=lora.alpha, targets=targets,
                   dropout=lora.dropout, quantize=lora.quantize, rngs=nnx.Rngs(cfg.train.seed))
        trainable = LoRAParam
    if cfg.model.train_layers is not None:
        trainable = nnx.All(trainable, top_blocks(text, cfg.model.train_layers))
        if text is not model:  # the tower and the connector sit below every text block
            trainable = nnx.All(trainable, nnx.PathContains("text"))
    if text is not model and cfg.model.vision.freeze:  # the tower keeps its loaded weights
        trainable = nnx.All(trainable, nnx.Not(nnx.PathContains("vision")))
    if text.config.moe is not None:  # mixture of experts: router losses, frozen routers
        from hone.models.moe import RouterLoss
        moe = cfg.model.moe
        text.router_loss = RouterLoss(moe.aux_loss_coef, moe.z_loss_coef)
        if moe.freeze_router:  # a routed MLP's router is its `router` parameter
            trainable = nnx.All(trainable, nnx.Not(nnx.PathContains("router")))
    text.remat = cfg.train.remat
    text.scan_layers = scan_setting(cfg.train.scan_layers, cfg.train.remat)
    text.attention = cfg.model.attention
    text.head_chunk = cfg.train.head_chunk
    return trainable


def build_reward_model(cfg, layout=None):
    """(RewardModel, trainable filter): the head always trains; the backbone fully, through
    its adapters, or its top model.train_layers blocks only."""
    from hone.models.reward import RewardModel
    backbone, trainable = build_model(cfg, layout=layout)
    model = RewardModel(backbone, rngs=nnx.Rngs(cfg.train.seed))
    return model, also_train(trainable, "head")


def open_run(cfg) -> Path:
    """The run folder with the resolved config written into it (after all input was checked)."""
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    if jax.process_index() == 0:  # one writer; the other processes hold the same config
        from hone.checkpoint import ensure_unlocked
        ensure_unlocked(run_dir / "checkpoints")  # a run already using run_dir: refuse now
        dump_yaml(cfg, run_dir / "config.yaml")
    return run_dir


def make_layout(cfg, rows_per_example: int = 1, devices=None) -> Layout:
    """The run's Layout (cfg.mesh over `devices`, default all), its batch checked against it."""
    layout = Layout.from_config(cfg, devices)
    check_layout(cfg, layout, rows_per_example)
    return layout


def check_layout(cfg, layout: Layout, rows_per_example: int = 1) -> None:
    """The batch must split over the mesh: rows over data x fsdp x expert, and in the all-reduce
    mode each device's rows into grad_accum micro-batches."""
    t = cfg.train
    what = "rows" if rows_per_example == 1 else "pairs"
    layout.check_rows(t.batch_size, "train.batch_size", what)
    if layout.mode == "allreduce" and (t.batch_size // layout.shards) % t.grad_accum:
        raise InputError(f"{t.batch_size // layout.shards} {what} per device do not split "
                         f"into train.grad_accum = {t.grad_accum} micro-batches",
                         key="train.grad_accum")


def compile_steps(cfg, model: nnx.Module, trainable, loss_fn, normalizer_fn, *,
                  split=row_split, layout: Layout | None = None, make_step=None):
    """(graphdef, params template, frozen rest, fresh train state, train step, eval step).

    The model is placed on the mesh of cfg.mesh (or `layout`) first, so the frozen rest, the
    parameters and the optimizer state are all sharded by their logical names. `make_step`
    (graphdef, params, optimizer, schedule, accum) -> jitted step replaces the plain train
    step for recipes whose step does more around the update (KTO's reference point, online
    DPO's skipped batches)."""
    layout = layout or make_layout(cfg)
    layout.check_experts(model)
    layout.place_model(model)
    graphdef, params, frozen = split_model(model, trainable)
    optimizer, schedule = build_optimizer(cfg.train)
    state = new_train_state(train_params(model, params), optimizer, cfg.train.seed)
    state = layout.place_train_state(state, logical_names(params))
    def build(accum: int):
        if make_step is not None:
            return make_step(graphdef, params, optimizer, schedule, accum)
        return make_train_step(graphdef, params, loss_fn, normalizer_fn, optimizer, schedule,
                               accum=accum, precision=cfg.train.precision, split=split,
                               layout=layout)

    # Rebuilt with more accumulation when the step runs out of memory (hone.train.oom).
    step = AccumStep(build, cfg.train.grad_accum, cfg.train.batch_size, layout.shards)
    eval_step = make_eval_step(graphdef, params, loss_fn, precision=cfg.train.precision)
    return graphdef, params, frozen, state, step, eval_step


def summed_eval(eval_step, frozen, data, means: Callable[[dict], dict], aux=None,
                place=lambda batch: batch, max_batches: int = 0):
    """params -> means(sums of every metric over the held-out batches, keys prefixed eval_):
    the first `max_batches` of data.batches() (train.eval_batches), 0: all of them."""

    def evaluate(params) -> dict:
        total: dict[str, float] = {}
        batches = data.batches(max_batches=max_batches) if max_batches else data.batches()
        for batch in map(place, batches):
            for k, v in jax.device_get(eval_step(params, frozen, batch, aux)).items():
                total["eval_" + k] = total.get("eval_" + k, 0.0) + float(v)
        return means(total)

    return evaluate
