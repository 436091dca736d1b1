"""The configuration of the training commands: one frozen dataclass per YAML section.

This file owns the names, types, defaults and rules of every config key (`hone.config.load` reads
files into these classes). Design choices:

- Every field is defaulted, so an empty file is a valid config and a test can build
  `SFTConfig(train=TrainSection(max_steps=2))` in Python.
- Single-value rules (allowed values, bounds, "compiles as a regex") are field metadata, checked by
  the loader with the key and file in the message. Rules between fields live in
  `TrainConfig.__post_init__`, which also re-checks the metadata, so Python-built configs obey too.
- One class per command (`SFTConfig`, later `DPOConfig` with a `dpo:` section, ...) so that each
  command rejects the keys of the others. A subclass that adds `__post_init__` calls super's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hone.config.fields import check_fields
from hone.errors import InputError


def _regex(value: str) -> str | None:
    """`check` rule: the value compiles as a Python regular expression."""
    try:
        re.compile(value)
    except re.error as e:
        return f"not a valid regular expression: {e}"
    return None


def _axis_size(value: int) -> str | None:
    """`check` rule for a mesh axis: -1 (all devices left over) or a positive size."""
    if value == -1 or value >= 1:
        return None
    return f"must be -1 (the devices left over) or a size >= 1, got {value}"


@dataclass(frozen=True)
class LoraSection:
    # Adapter rank; 0 = no adapters, every parameter of the model trains.
    rank: int = field(default=0, metadata={"min": 0})
    # The adapter update is scaled by alpha / rank.
    alpha: float = 16.0
    # Dropout on the adapter input; 1 would zero every update.
    dropout: float = field(default=0.0, metadata={"min": 0.0, "lt": 1.0})
    # Which linear layers get adapters: re.fullmatch against "/"-joined module paths such as
    # "layers/3/attn/q". The default is every attention and MLP projection; a mixture-of-experts
    # model's routed experts ("layers/3/mlp/experts/gate", up, down) only when named; a
    # vision-language model's language model only ("text/layers/3/attn/q"; its tower's are
    # "vision/layers/3/attn/q", "vision/layers/3/mlp/fc1", its connector "connector/proj").
    targets: str = field(default=r".*/(attn/(q|k|v|o)|mlp/(gate|up|down))",
                         metadata={"check": _regex})
    # Storage of the frozen base weights: none, nf4 (QLoRA) or int8. Needs rank > 0.
    quantize: str = field(default="none", metadata={"choices": ("none", "nf4", "int8")})


@dataclass(frozen=True)
class MoeSection:
    # Mixture-of-experts models only (docs/guides/moe.md); ignored for dense ones.
    # Load-balancing loss (Switch/Mixtral form: E x sum over experts of the fraction of top-k
    # choices times the mean router probability) added to every command's loss, times this.
    # transformers' router_aux_loss_coef default for Mixtral and Qwen-MoE.
    aux_loss_coef: float = field(default=0.001, metadata={"min": 0.0})
    # Router z-loss (mean logsumexp(router logits)^2, ST-MoE) added times this; 0 = off.
    z_loss_coef: float = field(default=0.0, metadata={"min": 0.0})
    # Keep every router's weights as loaded (no update): routing then drifts only through the
    # hidden states, which keeps RL's sampler and trainer choosing the same experts longer.
    freeze_router: bool = False


@dataclass(frozen=True)
class VisionSection:
    # Vision-language models only (docs/guides/vision.md); ignored for text models.
    # Keep the vision tower's weights as loaded: the language model and the connector train
    # (with LoRA: adapters on the tower, if model.lora.targets names any, stay frozen too).
    freeze: bool = False


@dataclass(frozen=True)
class ModelSection:
    # Anything hone.load_model takes: a preset name, a Hugging Face folder or a .gguf file.
    source: str = "tiny"
    # Dtype the parameters are stored in.
    dtype: str = field(default="float32", metadata={"choices": ("float32", "bfloat16")})
    # Low-rank adapters (LoRA / QLoRA); off by default.
    lora: LoraSection = field(default_factory=LoraSection)
    # Train only the top N transformer blocks and what sits above them (final norm, untied LM
    # head, a reward model's head); the embedding and the lower blocks stay frozen, and no
    # backward pass runs through them. With adapters: only the top N blocks' adapters train.
    # None = every block.
    train_layers: int | None = field(default=None, metadata={"min": 1})
    # How attention is computed in training and scoring. dense: all T x T scores at once;
    # blockwise: blocks of 256 queries and keys with an online softmax (memory O(T x 256), the
    # same numbers, key blocks no query can see skipped); cudnn / splash: the GPU / TPU fused
    # kernels, blockwise for masks they cannot express (cudnn: packing, left padding, soft-cap,
    # float32; splash: shared-prefix branches); auto: dense while a row fits in one block, else
    # cudnn on GPU, splash on a single TPU chip (unpartitioned on a mesh), else blockwise.
    attention: str = field(default="auto", metadata={
        "choices": ("auto", "dense", "blockwise", "cudnn", "splash")})
    # Router losses and router freezing of mixture-of-experts models.
    moe: MoeSection = field(default_factory=MoeSection)
    # The vision tower of a vision-language model.
    vision: VisionSection = field(default_factory=VisionSection)


@dataclass(frozen=True)
class DataSection:
    # Training records: a JSONL or Parquet file, a saved `datasets` folder, or "builtin:NAME".
    path: str = "builtin:arithmetic"
    # Evaluation records, same forms; None = no evaluation.
    eval_path: str | None = "builtin:arithmetic-eval"
    # Record layout; auto detects it from the fields of the records.
    format: str = field(default="auto",
                        metadata={"choices": ("auto", "messages", "prompt_completion", "text")})
    # Tokens per sequence, prompt included.
    max_length: int = field(default=256, metadata={"min": 8})
    # Pack several records into each sequence (attention stays within a record).
    pack: bool = False
    # completion = loss only on assistant/completion tokens; all = on every token.
    loss_on: str = field(default="completion", metadata={"choices": ("completion", "all")})
    # What to do with a record longer than max_length: cut it, or skip it.
    overlong: str = field(default="truncate", metadata={"choices": ("truncate", "drop")})
    # Use only the first N records; None = all of them.
    max_records: int | None = field(default=None, metadata={"min": 1})


@dataclass(frozen=True)
class TrainSection:
    # Optimizer steps to train for (a resumed run continues up to this).
    max_steps: int = field(default=100, metadata={"min": 1})
    # Sequences per optimizer step, over all devices and micro-batches.
    batch_size: int = field(default=8, metadata={"min": 1})
    # Micro-batches per step whose gradients are summed; must divide batch_size.
    grad_accum: int = field(default=1, metadata={"min": 1})
    # Peak learning rate.
    lr: float = field(default=1e-4, metadata={"min": 0.0})
    # Learning-rate decay after warmup, down to min_lr_ratio * lr at max_steps.
    schedule: str = field(default="cosine", metadata={"choices": ("constant", "linear", "cosine")})
    # Steps of linear warmup from 0 to lr; fewer than max_steps.
    warmup_steps: int = field(default=0, metadata={"min": 0})
    # Final learning rate as a fraction of lr.
    min_lr_ratio: float = field(default=0.0, metadata={"min": 0.0, "max": 1.0})
    # Decoupled (AdamW) weight decay.
    weight_decay: float = field(default=0.0, metadata={"min": 0.0})
    # Adam first-moment decay.
    b1: float = field(default=0.9, metadata={"min": 0.0, "lt": 1.0})
    # Adam second-moment decay.
    b2: float = field(default=0.999, metadata={"min": 0.0, "lt": 1.0})
    # Adam denominator epsilon.
    eps: float = field(default=1e-8, metadata={"min": 0.0})
    # Clip the global gradient norm to this; 0 = no clipping.
    max_grad_norm: float = field(default=1.0, metadata={"min": 0.0})
    # Seed of parameter init, data order, dropout and sampling.
    seed: int = field(default=0, metadata={"min": 0})
    # fp32, or bf16 = bf16 compute with fp32 parameters, optimizer state and accumulation.
    precision: str = field(default="fp32", metadata={"choices": ("fp32", "bf16")})
    # Rematerialization of each block in the backward pass (memory for compute): full keeps
    # each block's input, save_attention also blockwise attention's output (its forward is
    # not run again), save_dots the projections' outputs, offload those in host memory.
    remat: str = field(default="none", metadata={
        "choices": ("none", "full", "save_dots", "save_attention", "offload")})
    # How the blocks run: "scan" = a scan over their weights, stored stacked in the train state
    # (checkpoints keep per-layer names; the compiled step does not grow with depth), "loop" =
    # a Python loop (same numbers). With remat the scan keeps one hidden state per block for
    # the backward pass (the loop let XLA keep every block's intermediates). auto = scan when
    # remat is not none (hone/models/scan_layers.py, hone/models/stacked.py). Not true/false:
    # YAML would read those as booleans.
    scan_layers: str = field(default="auto", metadata={"choices": ("auto", "scan", "loop")})
    # Positions per chunk of the LM head and its losses (hone.models.head): a longer row is
    # scored chunk by chunk, its [chunk, vocab] logits recomputed in the backward pass, so no
    # [length, vocab] logits tensor is formed; rows of at most this many positions run as one
    # piece, unchanged. 0 = always the whole row.
    head_chunk: int = field(default=1024, metadata={"min": 0})
    # Evaluate every N steps; 0 = only at the end.
    eval_every: int = field(default=0, metadata={"min": 0})
    # Held-out batches per evaluation (SFT, DPO, KTO, reward, distill: the first N, in order);
    # 0 = the whole held-out set.
    eval_batches: int = field(default=0, metadata={"min": 0})


@dataclass(frozen=True)
class CheckpointSection:
    # Save every N steps; 0 = only at the end.
    every_steps: int = field(default=50, metadata={"min": 0})
    # Newest checkpoints kept on disk.
    keep: int = field(default=3, metadata={"min": 1})
    # Write checkpoints in the background while training continues.
    async_save: bool = True
    # After SIGTERM/SIGINT the run saves at the next step boundary and exits; if that has not
    # happened this many seconds after the signal, it exits at once with the last checkpoint
    # kept (a second signal does the same). null = wait for the step boundary however long.
    grace_seconds: float | None = field(default=None, metadata={"min": 0.0})


@dataclass(frozen=True)
class LogSection:
    # Log metrics every N steps.
    every_steps: int = field(default=1, metadata={"min": 1})
    # Where metrics go; jsonl writes run_dir/metrics.jsonl; wandb needs the wandb package.
    sinks: tuple[str, ...] = field(
        default=("console", "jsonl", "tensorboard"),
        metadata={"choices": ("console", "jsonl", "tensorboard", "prometheus", "wandb")})
    # Peak FLOP/s of one device, for MFU; None = unknown, MFU not logged.
    peak_flops: float | None = field(default=None, metadata={"gt": 0.0})
    # Port of the prometheus sink's /metrics endpoint; 0 = a free port, printed at start.
    prometheus_port: int = field(default=9464, metadata={"min": 0, "max": 65535})
    # Address the prometheus sink listens on; loopback by default, "0.0.0.0" = every interface.
    prometheus_host: str = "127.0.0.1"
    # Weights & Biases project of the wandb sink; None = WANDB_PROJECT or W&B's default.
    wandb_project: str | None = None
    # Steps to trace with jax.profiler into run_dir/profile (first to last chosen step), logging
    # the share of device op time spent in collectives; () = no tracing.
    profile_steps: tuple[int, ...] = field(default=(), metadata={"min": 1})


@dataclass(frozen=True)
class MeshSection:
    # Data-parallel axis size (parameters replicated, rows split); -1 = the devices left over.
    data: int = field(default=-1, metadata={"check": _axis_size})
    # Fully sharded data-parallel axis size (parameters sharded); -1 = the devices left over.
    fsdp: int = field(default=1, metadata={"check": _axis_size})
    # Expert-parallel axis size (mixture-of-experts models): the experts are split over it, and
    # rows too, like data (docs/guides/moe.md); must divide the number of experts; -1 = the
    # devices left over.
    expert: int = field(default=1, metadata={"check": _axis_size})
    # Tensor-parallel axis size; -1 = the devices left over.
    tp: int = field(default=1, metadata={"check": _axis_size})
    # Sequence-parallel axis size: each row's tokens are split over it (ring attention, see
    # docs/guides/long-context.md); row lengths must be multiples of it; -1 = the devices left over.
    seq: int = field(default=1, metadata={"check": _axis_size})
    # gspmd: XLA partitions the step from the shardings; allreduce: per-device gradients under
    # shard_map, averaged by an explicit psum over `data` (needs fsdp = expert = tp = 1).
    mode: str = field(default="gspmd", metadata={"choices": ("gspmd", "allreduce")})


@dataclass(frozen=True)
class DistributedSection:
    # "host:port" of process 0 for a multi-process run; "" = one process, unless `auto` is set
    # or the environment names a coordinator (JAX_COORDINATOR_ADDRESS).
    coordinator: str = ""
    # Number of processes (with coordinator); 0 = from the environment (JAX_NUM_PROCESSES).
    num_processes: int = field(default=0, metadata={"min": 0})
    # This process's index (with coordinator); -1 = from the environment (JAX_PROCESS_ID).
    process_id: int = field(default=-1, metadata={"min": -1})
    # Let JAX detect the cluster (TPU pod slices, SLURM, Open MPI) and initialise itself.
    auto: bool = False


@dataclass(frozen=True)
class GuardSection:
    # Non-finite (NaN/inf) loss or gradient steps in a row that trigger a rollback; each such
    # step is skipped (no update) either way.
    max_skips: int = field(default=3, metadata={"min": 1})
    # Roll back when the loss exceeds this times its moving average; None = off.
    spike_factor: float | None = field(default=None, metadata={"gt": 1.0})
    # Decay of the loss moving average (EMA) the spike test compares against.
    ema_beta: float = field(default=0.99, metadata={"min": 0.0, "lt": 1.0})
    # Applied steps averaged into the EMA before the spike test starts.
    warmup_steps: int = field(default=20, metadata={"min": 0})
    # Roll back when the gradient norm (before clipping) exceeds this; None = off.
    max_grad_norm: float | None = field(default=None, metadata={"gt": 0.0})
    # RL only: roll back when the logged KL to the reference exceeds this (GRPO's per-token
    # `kl`, PPO's per-sequence `kl_seq`); None = off.
    max_kl: float | None = field(default=None, metadata={"gt": 0.0})
    # Each rollback multiplies the learning rate by this (the scale is checkpointed).
    lr_factor: float = field(default=0.8, metadata={"gt": 0.0, "max": 1.0})
    # Rollbacks allowed in one run before it stops with an error.
    max_rollbacks: int = field(default=5, metadata={"min": 0})


@dataclass(frozen=True)
class TrainConfig:
    # Folder for checkpoints, metrics.jsonl and the resolved config.yaml; reused = resume.
    run_dir: str = "runs/default"
    # The model to train and its adapters.
    model: ModelSection = field(default_factory=ModelSection)
    # Training and evaluation records.
    data: DataSection = field(default_factory=DataSection)
    # Optimizer, schedule, batch and precision.
    train: TrainSection = field(default_factory=TrainSection)
    # Saving and keeping checkpoints.
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    # Metrics logging.
    log: LogSection = field(default_factory=LogSection)
    # Device mesh axis sizes.
    mesh: MeshSection = field(default_factory=MeshSection)
    # Several processes (hosts) training as one: jax.distributed.
    distributed: DistributedSection = field(default_factory=DistributedSection)
    # Skipping non-finite steps, rolling back on spikes (hone.train.guards).
    guard: GuardSection = field(default_factory=GuardSection)

    def __post_init__(self):
        check_fields(self)
        if not self.run_dir.strip():
            raise InputError("must name a folder, got an empty string", key="run_dir")
        lora, train, mesh = self.model.lora, self.train, self.mesh
        if lora.quantize != "none" and lora.rank == 0:
            raise InputError(f"'{lora.quantize}' quantizes the frozen base, so it needs adapters "
                             f"to train: set model.lora.rank > 0, or model.lora.quantize to none",
                             key="model.lora.quantize")
        if train.batch_size % train.grad_accum:
            raise InputError(f"{train.batch_size} is not divisible by train.grad_accum "
                             f"({train.grad_accum}), the number of micro-batches per step",
                             key="train.batch_size")
        if train.warmup_steps and train.warmup_steps >= train.max_steps:
            raise InputError(f"{train.warmup_steps} must be less than train.max_steps "
                             f"({train.max_steps})", key="train.warmup_steps")
        rest = [f"mesh.{axis}" for axis in ("data", "fsdp", "expert", "seq", "tp")
                if getattr(mesh, axis) == -1]
        if len(rest) > 1:
            raise InputError(f"only one mesh axis can be -1 (the devices left over), "
                             f"got {' and '.join(rest)}", key=rest[1])


@dataclass(frozen=True)
class SFTConfig(TrainConfig):
    """`hone sft`: supervised fine-tuning. No keys beyond TrainConfig's."""


def preference_data() -> DataSection:
    return DataSection(path="builtin:arithmetic-pref", eval_path="builtin:arithmetic-pref-eval")


@dataclass(frozen=True)
class RewardSection:
    # Required gap between chosen and rejected rewards inside the log-sigmoid; None = 0.
    margin: float | None = None
    # Reward centering: coef * mean((r_chosen + r_rejected)^2) keeps rewards near zero.
    center_coef: float = field(default=0.0, metadata={"min": 0.0})
    # Score each pair's prompt once: one row [prompt | chosen | rejected] in which the answers
    # cannot see each other, each reward read at its answer's last token. The same rewards as
    # two rows per pair (to float rounding) for fewer FLOPs; false: two rows.
    shared_prompt: bool = True


@dataclass(frozen=True)
class RewardConfig(TrainConfig):
    """`hone reward`: a scalar reward model trained on preference pairs."""

    # Preference pairs: `prompt` + `chosen` + `rejected`.
    data: DataSection = field(default_factory=preference_data)
    # The Bradley-Terry loss's options.
    reward: RewardSection = field(default_factory=RewardSection)
