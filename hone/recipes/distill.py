"""`hone distill`: knowledge distillation from a frozen teacher into a student.

Modes (distill.mode; see hone/config/distill_schema.py): online (the teacher runs on every batch
inside the train step), offline (its top-k logits are cached to run_dir once), sequence (the
student learns the teacher's own answers with the SFT loss) and on_policy (GKD: the student's
samples replace a share lmbda of the completions, and the teacher's distribution is distilled
on them). Every mode evaluates the same way (hone/eval/distillation.py), starting at step 0.

The teacher lives in the same process, frozen: its state is an argument of the jitted step (no
gradient, no optimizer state), stored in teacher.dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from flax import nnx

from hone.config import DistillConfig
from hone.data.loader import SFTData
from hone.data.sft_prompts import prompts_of
from hone.distill.loss import make_distill_loss, make_eval_loss, normalizer, train_means
from hone.distill.student import (build_student, check_mapped, check_vocab, layer_maps,
                                  load_teacher)
from hone.eval.distillation import GreedyAgreement, distill_eval_means
from hone.losses.sft import sft_loss_from_logprobs
from hone.tokenizer import load_tokenizer
from hone.train.build import compile_steps, make_layout, open_run, summed_eval
from hone.train.loop import LoopSpec, run_loop
from hone.train.scoring import row_logprobs
from hone.train.state import unflatten
from hone.train.step import make_eval_step


def sequence_loss(student, mb, normalizer, key, aux):
    """The SFT loss on the teacher-written data (the teacher is not run)."""
    loss, metrics = sft_loss_from_logprobs(row_logprobs(student.model, mb)[0], mb["loss_mask"],
                                           normalizer["targets"])
    metrics["targets"] = metrics.pop("target_tokens")
    return loss, metrics


def _data(cfg, tokenizer, path: str, log, what: str) -> SFTData:
    d = cfg.data
    data = SFTData(path, tokenizer, format=d.format, max_length=d.max_length, pack=d.pack,
                   loss_on=d.loss_on, overlong=d.overlong, max_records=d.max_records,
                   batch_size=cfg.train.batch_size, seed=cfg.train.seed)
    log(f"{what}: {data.describe()}")
    return data


@dataclass
class Teacher:
    """The frozen teacher's pieces: graph, weights (on its own devices when `remote`), model
    config, tokenizer, vocabulary map (or None) and the remote runner (or None)."""
    graphdef: Any
    state: Any
    config: Any
    tokenizer: Any
    vocab: np.ndarray | None
    remote: Any = None

    @property
    def model(self):
        return nnx.merge(self.graphdef, self.state)


def _teacher(cfg, loaded, student, tokenizer, layout) -> tuple[Teacher, dict]:
    """The loaded teacher (graphdef, state, config), checked against the student (vocabulary,
    layer pairs), and the layer maps."""
    d = cfg.distill
    graphdef, state, config = loaded
    vocab = None
    if d.mode != "sequence" or d.vocab_map is not None:
        vocab = check_vocab(student.config, config, d.vocab_map)
    tok = (tokenizer if cfg.teacher.source == cfg.model.source
           else load_tokenizer(cfg.teacher.source))
    maps = layer_maps(cfg, student.config.num_layers, config.num_layers)
    teacher = Teacher(graphdef, state, config, tok, vocab)
    if cfg.teacher.devices:
        from hone.distill.placement import RemoteTeacher, split_devices
        devices, _ = split_devices(cfg.teacher.devices)
        teacher.remote = RemoteTeacher(graphdef, state, maps, d.top_k, devices,
                                       layout.place_batch, vocab)
        teacher.state = teacher.remote.state
    else:  # in the student's step: on the student's mesh, sharded like the student
        teacher.state = layout.place_state(state)
    return teacher, maps


def _evaluation(cfg, teacher: Teacher, tokenizer, eval_step, frozen, eval_data, student_of,
                place):
    """params -> held-out metrics: the summed token metrics plus greedy-answer agreement."""
    if teacher.remote is None:
        summed = summed_eval(eval_step, frozen, eval_data, distill_eval_means, aux=teacher.state,
                             place=place, max_batches=cfg.train.eval_batches)
    else:
        from hone.distill.placement import WithTeacher
        summed = summed_eval(eval_step, frozen, WithTeacher(eval_data, teacher.remote),
                             distill_eval_means, place=place, max_batches=cfg.train.eval_batches)
    d, agreement = cfg.distill, None
    if d.eval_prompts:
        prompts, refs, _ = prompts_of(cfg.data.eval_path, tokenizer, d.eval_prompts)
        if prompts:
            theirs = prompts_of(cfg.data.eval_path, teacher.tokenizer, d.eval_prompts)[0]
            agreement = GreedyAgreement(teacher.model, teacher.tokenizer, theirs, tokenizer,
                                        prompts, refs, d.max_new_tokens)

    def evaluate(p):
        out = summed(p)
        if agreement is not None:
            out.update(agreement(student_of(p)))
        return out

    return evaluate


def run_distill(cfg: DistillConfig, *, log=print):
    """Train per cfg; returns (trained student Transformer, final train state)."""
    d = cfg.distill
    tokenizer = load_tokenizer(cfg.model.source)
    loaded = load_teacher(cfg)
    student, trainable = build_student(cfg, loaded[2].hidden_size)
    student_devices = None
    if cfg.teacher.devices:
        from hone.distill.placement import split_devices
        student_devices = split_devices(cfg.teacher.devices)[1]
    layout = make_layout(cfg, devices=student_devices)
    teacher, maps = _teacher(cfg, loaded, student, tokenizer, layout)
    vocab = teacher.vocab
    train_data = None if d.mode == "sequence" else _data(cfg, tokenizer, cfg.data.path, log,
                                                         "data")
    eval_data = _data(cfg, tokenizer, cfg.data.eval_path, log, "eval data") if (
        cfg.data.eval_path) else None
    for data in (train_data, eval_data):
        if data is not None:
            check_mapped(vocab, data.rows, data.path)
    run_dir = open_run(cfg)
    if d.mode == "sequence":
        from hone.distill.sequence_level import teacher_dataset
        path = teacher_dataset(cfg, teacher.model, teacher.tokenizer, run_dir, log=log)
        train_data = _data(cfg, tokenizer, str(path), log, "teacher data")
        check_mapped(vocab, train_data.rows, train_data.path)
        loss_fn = sequence_loss
    else:
        loss_fn = make_distill_loss(cfg, teacher.graphdef, maps, vocab)
    graphdef, params, frozen, state, step, _ = compile_steps(
        cfg, student, trainable, loss_fn, normalizer, layout=layout)

    # Where the teacher's side of the loss comes from: a forward in the step (aux = its
    # weights), the cache, its own devices (with the batch), or nowhere (sequence-level).
    data, aux = train_data.iterator(), teacher.state
    if d.mode == "offline":
        from hone.distill.teacher_cache import build_cache, cached_iterator
        values, indices = build_cache(cfg, train_data.rows, teacher.graphdef, teacher.state,
                                      run_dir, batch_size=cfg.train.batch_size, vocab=vocab,
                                      log=log)
        data = cached_iterator(train_data.rows, cfg.train.batch_size, cfg.train.seed,
                               values, indices)
        aux = None
    elif d.mode == "sequence":
        aux = None

    def student_of(p):
        return nnx.merge(graphdef, unflatten(params, p), frozen).model

    prepare = None
    if d.mode == "on_policy":
        from hone.distill.on_policy import OnPolicy
        prepare = OnPolicy(cfg, tokenizer, student_of, train_data.max_length,
                           train_data.pad_id)
    if teacher.remote is not None and aux is not None:
        aux, sample = None, prepare

        def prepare(state, batch, step):
            batch, host = sample(state, batch, step) if sample else (batch, {})
            return dict(batch, teacher=teacher.remote(batch)), host

    eval_fn = None
    same_vocab = student.config.vocab_size == teacher.config.vocab_size or vocab is not None
    if eval_data is not None and same_vocab:  # token metrics need one vocabulary (or the map)
        eval_step = make_eval_step(graphdef, params, make_eval_loss(teacher.graphdef, vocab),
                                   precision=cfg.train.precision)
        eval_fn = _evaluation(cfg, teacher, tokenizer, eval_step, frozen, eval_data,
                              student_of, layout.place_batch)

    flops = student.config.flops_per_token(cfg.data.max_length)
    if d.mode in ("online", "on_policy"):  # + the teacher's forward, a third of training's
        flops += teacher.config.flops_per_token(cfg.data.max_length) / 3
    spec = LoopSpec(
        train_step=step, state=state, frozen=frozen, data=data, eval_fn=eval_fn, aux=aux,
        tokens_per_batch=lambda b: int(np.sum(b["attention_mask"])), flops_per_token=flops,
        extra_metrics=train_means, prepare=prepare, eval_at_start=True,
        place_batch=layout.place_batch)
    final = run_loop(spec, cfg, run_dir)
    return student_of(final["params"]), final
