"""The two models of a distillation run: the frozen teacher and the trained student.

- The teacher is loaded once, in its own dtype (bfloat16 halves its memory), split into a graph
  definition and a state that the train step receives as an argument (never trained, never in
  the optimizer, never baked into the program as a constant).
- The student is `model.source`, optionally cut down to some of its blocks (`student_layers`:
  "initialised from the teacher's layers" when model.source is the teacher), with LoRA when
  asked. It is wrapped in `DistillStudent` together with the learned projections that feature
  matching needs when student and teacher widths differ, so one trainable filter and one
  checkpoint cover both. Export takes `.model`.
- Layer maps: a student block kept from teacher block j pairs with j by default, for attention
  maps and hidden states alike (hidden state l >= 1 is the output of block l).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from flax import nnx

from hone.errors import InputError
from hone.models.linear import Linear
from hone.models.transformer import Transformer
from hone.train.build import prepare_for_training
from hone.train.state import also_train
from hone.weights.loading import load_model


class DistillStudent(nnx.Module):
    """The student transformer plus one [Ds, Dt] projection per matched hidden state (only when
    the widths differ)."""

    def __init__(self, model: Transformer, projections: int, teacher_width: int, seed: int):
        self.model = model
        self.config = model.config
        width = model.config.hidden_size
        dtype = model.embedder.embedding[...].dtype
        rngs = nnx.Rngs(seed)
        self.projections = nnx.List([
            Linear((width,), (teacher_width,), ("embed", "teacher_embed"), dtype, rngs)
            for _ in range(projections if width != teacher_width else 0)])


def keep_layers(model: Transformer, keep: tuple[int, ...], where: str) -> Transformer:
    """In place: keep only blocks `keep` (in order) of `model`; returns it."""
    n = len(model.layers)
    bad = [i for i in keep if i >= n]
    if bad:
        raise InputError(f"the model has {n} blocks (0..{n - 1}); {bad} do not exist",
                         key=where)
    cfg = model.config
    model.layers = nnx.List([model.layers[i] for i in keep])
    model.config = dataclasses.replace(cfg, num_layers=len(keep),
                                       layer_types=tuple(cfg.layer_types[i] for i in keep))
    return model


def load_teacher(cfg):
    """(graphdef, state, model config) of the frozen teacher."""
    teacher = load_model(cfg.teacher.source, dtype=cfg.teacher.dtype)
    graphdef, state = nnx.split(teacher)
    return graphdef, state, teacher.config


def teacher_width(cfg) -> int:
    """The teacher's hidden size, which only shapes feature projections (export rebuilds the
    student without loading the teacher unless feature matching was on)."""
    if not cfg.distill.feature_weight:
        return 0
    return load_model(cfg.teacher.source, dtype=cfg.teacher.dtype).config.hidden_size


def layer_maps(cfg, student_layers: int, teacher_layers: int) -> dict[str, tuple]:
    """{"attention": ((s, t), ...), "hidden": ((s, t), ...)} with every index checked; an empty
    hidden tuple means the final-normed hidden states."""
    d = cfg.distill
    kept = d.student_layers or tuple(range(student_layers))

    def teacher_block(i: int) -> int:
        return kept[i] if i < len(kept) else i

    def check(pairs, s_max, t_max, key):
        pairs = tuple(pairs)
        for s, t in pairs:
            if s > s_max or t > t_max:
                raise InputError(f"pair (student {s}, teacher {t}) is out of range: the student "
                                 f"allows 0..{s_max}, the teacher 0..{t_max}", key=key)
        return pairs

    attn_t = d.attention_teacher_layers or tuple(teacher_block(i) for i in d.attention_layers)
    hid_t = d.feature_teacher_layers or tuple(0 if h == 0 else teacher_block(h - 1) + 1
                                              for h in d.feature_layers)
    return {"attention": check(zip(d.attention_layers, attn_t), student_layers - 1,
                               teacher_layers - 1, "distill.attention_layers"),
            "hidden": check(zip(d.feature_layers, hid_t), student_layers, teacher_layers,
                            "distill.feature_layers")}


def build_student(cfg, teacher_width: int):
    """(DistillStudent, trainable filter)."""
    model = load_model(cfg.model.source, dtype=cfg.model.dtype, seed=cfg.train.seed)
    if cfg.distill.student_layers:
        keep_layers(model, cfg.distill.student_layers, "distill.student_layers")
    # the feature projections always train
    trainable = also_train(prepare_for_training(model, cfg), "projections")
    d = cfg.distill
    pairs = max(len(d.feature_layers), 1) if d.feature_weight else 0
    student = DistillStudent(model, pairs, teacher_width, cfg.train.seed)
    return student, trainable


def check_vocab(student_cfg, teacher_cfg, vocab_map: str | None) -> np.ndarray | None:
    """Token-level distillation compares distributions over one vocabulary: the same one, or
    the student's through `distill.vocab_map`; returns the map ([Vs] teacher ids, -1 where
    the teacher has no counterpart) or None."""
    vs, vt = student_cfg.vocab_size, teacher_cfg.vocab_size
    if vocab_map is None:
        if vs != vt:
            raise InputError(f"student vocabulary {vs} differs from the teacher's {vt}: "
                             "token-level distillation needs one vocabulary, or a map from the "
                             "student's token ids to the teacher's (distill.vocab_map), or "
                             "distill.mode: sequence (text only)", key="teacher.source")
        return None
    return load_vocab_map(vocab_map, vs, vt)


def load_vocab_map(path: str, student_vocab: int, teacher_vocab: int) -> np.ndarray:
    """A JSON object {"student id": teacher id, ...} -> int32 [student_vocab], -1 where unmapped.

    For students whose tokenizer splits text into the same pieces under other ids (a pruned or
    reordered vocabulary): the teacher reads the mapped ids, and its distribution is read at
    the mapped ids (its mass on tokens the student lacks is renormalised away)."""
    import json
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read the vocabulary map ({err})", path=path,
                         key="distill.vocab_map") from err
    if not isinstance(raw, dict) or not raw:
        raise InputError("must be a non-empty JSON object {\"student id\": teacher id}",
                         path=path, key="distill.vocab_map")
    out = np.full((student_vocab,), -1, np.int32)
    for key, value in raw.items():
        try:
            s = int(key)
        except ValueError:
            s = -1
        if not 0 <= s < student_vocab:
            raise InputError(f"key {key!r} is not a student token id in [0, {student_vocab})",
                             path=path, key="distill.vocab_map")
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < teacher_vocab:
            raise InputError(f"student id {key} maps to {value!r}, not a teacher token id in "
                             f"[0, {teacher_vocab})", path=path, key="distill.vocab_map")
        out[s] = value
    return out


def check_mapped(vocab: np.ndarray | None, rows: dict, path: str) -> None:
    """Every student token the teacher must read has a teacher counterpart."""
    if vocab is None:
        return
    tokens = rows["tokens"][rows["attention_mask"] > 0]
    missing = np.unique(tokens[vocab[tokens] < 0])
    if missing.size:
        raise InputError(f"student token ids {missing[:8].tolist()} occur in the data but have "
                         "no teacher id in distill.vocab_map", path=path,
                         key="distill.vocab_map")

