"""The configuration of `hone distill`: a frozen teacher, a student (`model:`), and how the
student learns from the teacher.

Design choices:
- `model:` is the student, as in every other command; `teacher:` names the teacher. A student
  "initialised from the teacher's layers" is `model.source` = the teacher's source plus
  `distill.student_layers`, the teacher blocks it keeps (in order).
- Layer pairs are two parallel lists (student index, teacher index) rather than a list of
  pairs, so every value is a plain typed key; the teacher list defaults to the blocks the
  student was initialised from, which is the pairing one almost always wants.
- Modes: `online` runs the teacher forward on each batch inside the train step; `offline`
  caches the teacher's top-k logits of every row to run_dir once and trains from the cache
  (no teacher in memory while training); `sequence` has the teacher answer every prompt once
  (run_dir/teacher_data.jsonl) and trains the student on those answers with the SFT loss;
  `on_policy` (GKD) replaces each batch's completions by the student's own samples with
  probability `lmbda` and distils the teacher's distribution on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hone.config.schema import TrainConfig
from hone.errors import InputError

MODES = ("online", "offline", "sequence", "on_policy")


@dataclass(frozen=True)
class TeacherSection:
    # The teacher: anything hone.load_model takes (preset, HF folder, .gguf).
    source: str = "tiny"
    # Dtype the teacher is stored and run in (bfloat16 halves its memory; its logits are
    # float32 either way).
    dtype: str = field(default="float32", metadata={"choices": ("float32", "bfloat16")})
    # Devices of the teacher's own: the last N of this host's (its sub-mesh; its weights sharded
    # over them, fsdp); 0 = it runs inside the student's step, on the student's devices.
    devices: int = field(default=0, metadata={"min": 0})


@dataclass(frozen=True)
class DistillSection:
    # online, offline (cached top-k teacher logits), sequence (teacher-written data) or
    # on_policy (GKD).
    mode: str = field(default="online", metadata={"choices": MODES})
    # Teacher blocks the student keeps (0-based, in order); empty = every block of model.source.
    student_layers: tuple[int, ...] = field(default=(), metadata={"min": 0})
    # Token-level divergence: forward_kl (teacher || student), reverse_kl, or jsd (TRL's
    # generalised JSD with beta).
    kind: str = field(default="forward_kl",
                      metadata={"choices": ("forward_kl", "reverse_kl", "jsd")})
    # The generalised JSD's interpolation (0 = forward KL, 1 = reverse KL).
    beta: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    # Softmax temperature of both distributions; the loss carries the temperature^2 factor.
    temperature: float = field(default=1.0, metadata={"gt": 0.0})
    # Mix with the cross-entropy on the data's tokens: alpha * distill + (1 - alpha) * CE;
    # None = distillation only.
    alpha: float | None = field(default=None, metadata={"min": 0.0, "max": 1.0})
    # Keep only the teacher's k largest logits (renormalised); None = all. offline needs it.
    top_k: int | None = field(default=None, metadata={"min": 1})
    # Weight of attention transfer (squared distance of attention maps); 0 = off.
    attention_weight: float = field(default=0.0, metadata={"min": 0.0})
    # Student blocks whose attention maps are matched (0-based).
    attention_layers: tuple[int, ...] = field(default=(), metadata={"min": 0})
    # The teacher block matched to each of attention_layers; empty = the block the student's
    # block was initialised from (student_layers), or the same index.
    attention_teacher_layers: tuple[int, ...] = field(default=(), metadata={"min": 0})
    # Weight of feature matching on hidden states; 0 = off. Widths that differ get a learned
    # linear projection.
    feature_weight: float = field(default=0.0, metadata={"min": 0.0})
    # Student hidden states matched: 0 = the embeddings, l = the output of block l; empty =
    # the final-normed states.
    feature_layers: tuple[int, ...] = field(default=(), metadata={"min": 0})
    # The teacher hidden state matched to each of feature_layers; empty = mapped through
    # student_layers (the output of the teacher block each student block came from).
    feature_teacher_layers: tuple[int, ...] = field(default=(), metadata={"min": 0})
    # Pooling before the comparison: masked mean over tokens, the last real token, or none
    # (every real token).
    feature_pool: str = field(default="mean", metadata={"choices": ("mean", "last", "none")})
    # Feature distance: l2 (mean squared difference) or cosine (1 - cosine similarity).
    feature_kind: str = field(default="cosine", metadata={"choices": ("l2", "cosine")})
    # on_policy: share of batches whose completions the student samples (GKD's lambda).
    lmbda: float = field(default=0.5, metadata={"min": 0.0, "max": 1.0})
    # sequence / on_policy generation: new tokens per answer.
    max_new_tokens: int = field(default=64, metadata={"min": 1})
    # sequence / on_policy generation: sampling temperature (0 = greedy).
    gen_temperature: float = field(default=1.0, metadata={"min": 0.0})
    # sequence / on_policy generation: paged = the rollout engine (docs/guides/rollouts.md: at
    # most max_seqs sequences at once over a paged cache, a finished one's place taken by the
    # next); static = the lockstep sampler; auto = paged on a CPU, static on a GPU or TPU (as
    # the RL sections' engine).
    engine: str = field(default="auto", metadata={"choices": ("auto", "paged", "static")})
    # Sequences the paged engine decodes at once; None = every answer of the batch, at most 64.
    max_seqs: int | None = field(default=None, metadata={"min": 1})
    # A JSON object {"student id": teacher id} for a student whose vocabulary differs from the
    # teacher's but splits text into the same pieces (a pruned or reordered vocabulary);
    # None = one vocabulary.
    vocab_map: str | None = None
    # Held-out prompts answered greedily by teacher and student at each evaluation
    # (agreement of their answers); 0 = skip.
    eval_prompts: int = field(default=32, metadata={"min": 0})


@dataclass(frozen=True)
class DistillConfig(TrainConfig):
    """`hone distill`: knowledge distillation from a frozen teacher into the student (`model:`)."""

    # The frozen teacher.
    teacher: TeacherSection = field(default_factory=TeacherSection)
    # How the student learns from it.
    distill: DistillSection = field(default_factory=DistillSection)

    def __post_init__(self):
        super().__post_init__()
        d = self.distill
        if d.mode == "offline" and d.top_k is None:
            raise InputError("offline distillation caches the teacher's top-k logits: set "
                             "distill.top_k (e.g. 64)", key="distill.top_k")
        if d.mode == "offline" and (d.attention_weight or d.feature_weight):
            raise InputError("offline distillation caches logits only; attention and feature "
                             "losses need the teacher online (distill.mode: online)",
                             key="distill.mode")
        if d.mode == "sequence" and (d.attention_weight or d.feature_weight or d.top_k):
            raise InputError("sequence-level distillation trains on the teacher's text with "
                             "the SFT loss; attention, feature and top_k settings do not apply",
                             key="distill.mode")
        if d.mode == "on_policy" and self.data.pack:
            raise InputError("on-policy distillation samples one completion per row: set "
                             "data.pack to false", key="data.pack")
        if len(set(d.student_layers)) != len(d.student_layers) or list(
                d.student_layers) != sorted(d.student_layers):
            raise InputError(f"{list(d.student_layers)} must be increasing block indices",
                             key="distill.student_layers")
        for name in ("attention", "feature"):
            s, t = (getattr(d, f"{name}_layers"), getattr(d, f"{name}_teacher_layers"))
            if t and len(t) != len(s):
                raise InputError(f"{len(t)} teacher layers for {len(s)} student layers: give "
                                 f"one per student layer, or none", key=f"distill.{name}_"
                                 "teacher_layers")
        if d.attention_weight and not d.attention_layers:
            raise InputError("attention transfer needs the student blocks to match: set "
                             "distill.attention_layers", key="distill.attention_layers")
