"""What the memory planner needs to know about a run, and how it is read from a config or from
a preset and command-line shapes.

`PlanInput` holds only the settings that change bytes: the architecture, storage and compute
dtypes, adapters, the remat policy, the shapes of the rows one optimizer step trains on, the
mesh, the reference/teacher/critic copies and the rollout shapes. Everything is resolved here
(the mesh's -1 axis, "auto" reference modes, the tree-row layout of RL updates), so the byte
model in weights.py / activations.py / rollout.py reads plain numbers.

Rows: `rows` rows of `row_len` tokens per optimizer step (whole batch, all devices), of which
`head_len` positions per row go through the LM head (DPO/GRPO tree rows score only answer slots).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from hone.errors import InputError
from hone.models.config import ModelConfig
from hone.sampling.paged import rollout_engine

COMMANDS = ("sft", "dpo", "kto", "reward", "grpo", "ppo", "distill")


@dataclass(frozen=True)
class PlanInput:
    command: str  # one of COMMANDS
    arch: ModelConfig
    param_dtype: str = "float32"  # model.dtype: storage of the weights (and Adam's moments)
    precision: str = "fp32"  # train.precision: bf16 = bf16 compute over fp32 master weights
    lora_rank: int = 0  # model.lora.rank; 0 = every parameter trains
    lora_targets: str = r".*/(attn/(q|k|v|o)|mlp/(gate|up|down))"  # model.lora.targets
    quantize: str = "none"  # model.lora.quantize: none | nf4 | int8 (frozen base storage)
    train_layers: int | None = None  # model.train_layers: only the top N blocks train
    remat: str = "none"  # train.remat: none | full | save_dots | save_attention | offload
    scan: bool = False  # blocks run as a scan (train.scan_layers resolved)
    head_chunk: int = 1024  # train.head_chunk: positions per chunk of the LM head; 0 = whole row
    attention: str = "auto"  # model.attention
    rows: int = 8  # rows per optimizer step, all devices
    row_len: int = 256  # tokens per row
    head_len: int = 256  # positions per row that go through the LM head
    grad_accum: int = 1  # micro-batches per step
    updates: int = 1  # optimizer updates run on one batch (RL iterations x minibatches)
    data: int = 1  # mesh.data
    fsdp: int = 1  # mesh.fsdp
    tp: int = 1  # mesh.tp
    seq: int = 1  # mesh.seq
    reference: str | None = None  # copy | adapters_off | precomputed | None
    teacher: ModelConfig | None = None  # distill: the frozen teacher's architecture
    teacher_dtype: str = "float32"
    critic: str | None = None  # ppo: shared | separate
    rollout_rows: int = 0  # RL: sequences sampled per step (prompts x group); 0 = no rollout
    rollout_len: int = 0  # RL: prompt + new tokens per sampled sequence
    cache_dtype: str = "auto"  # RL: KV-cache dtype; auto = param_dtype
    engine: str = "static"  # RL: static (a cache of rows x len) | paged (a page pool)
    max_seqs: int | None = None  # RL, paged: sequences at once; None = all rows, at most 64
    staleness: int = 0  # RL: max_staleness; > 0 keeps that many policy versions, and the
    # rollout's memory is alive during the update
    vision_params: int = 0  # a vision-language model: its tower's and connector's parameters
    vision_frozen: bool = False  # model.vision.freeze: they keep their loaded weights

    @property
    def devices(self) -> int:
        return self.data * self.fsdp * self.tp * self.seq

    @property
    def batch_shards(self) -> int:
        """How many ways the rows are split (data x fsdp)."""
        return self.data * self.fsdp

    def with_(self, **changes) -> "PlanInput":
        return replace(self, **changes)


def _dtype_bytes(name: str) -> int:
    return {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2}[name]


def param_bytes(p: PlanInput) -> int:
    return _dtype_bytes(p.param_dtype)


def compute_bytes(p: PlanInput) -> int:
    """Activations' bytes: bf16 when either the weights are stored or computed in bf16."""
    return 2 if p.precision == "bf16" or p.param_dtype == "bfloat16" else 4


def resolve_mesh(mesh, devices: int) -> dict[str, int]:
    """{data, fsdp, tp, seq} sizes of a MeshSection over `devices` devices (-1 resolved as
    hone.parallel.mesh does: the devices left over)."""
    sizes = {a: getattr(mesh, a) for a in ("data", "fsdp", "seq", "tp")}
    fixed = math.prod(s for s in sizes.values() if s != -1)
    for a, s in sizes.items():
        if s == -1:
            if devices % fixed:
                raise InputError(f"{devices} device(s) cannot be split with the other axes "
                                 f"({fixed} per {a} slot)", key=f"mesh.{a}")
            sizes[a] = devices // fixed
    return sizes


def _rl_rows(section, batch: int) -> tuple[int, int, int]:
    """(rows, row_len, head_len) of an RL update: one tree row per prompt [prompt | G samples]
    with shared_prompt, else one row per sample."""
    g, p, m = section.group_size, section.max_prompt_tokens, section.max_new_tokens
    if getattr(section, "shared_prompt", False) and g > 1:
        return batch // g, p + g * m, g * m
    return batch, p + m, m


def from_config(command: str, cfg, *, arch: ModelConfig | None = None, devices: int = 1,
                teacher: ModelConfig | None = None, vision_params: int = 0) -> PlanInput:
    """The PlanInput of a loaded config of `command` (hone.config.COMMANDS' classes). `arch`
    and `teacher`: the model's and the distillation teacher's architectures (default: the
    presets named by model.source and teacher.source); a vision-language model's `arch` is its
    language model's, `vision_params` its tower's and connector's parameters."""
    from hone.models.config import preset
    from hone.models.scan_layers import scan_setting
    if arch is None:
        arch = preset(cfg.model.source)
    t, lora = cfg.train, cfg.model.lora
    mesh = resolve_mesh(cfg.mesh, devices)
    length = cfg.data.max_length
    rows, row_len, head_len = t.batch_size, length, length
    extra: dict = {}
    if command in ("dpo", "kto", "grpo", "ppo"):
        from hone.train.reference import reference_mode
        extra["reference"] = reference_mode(cfg)
    if command == "dpo" and cfg.dpo.online:  # pairs of its own samples: a rollout first
        d = cfg.dpo
        row_len = d.max_prompt_tokens + 2 * d.max_new_tokens
        head_len = 2 * d.max_new_tokens
        if not d.shared_prompt:
            rows, row_len, head_len = 2 * t.batch_size, d.max_prompt_tokens + d.max_new_tokens, \
                d.max_new_tokens
        extra.update(rollout_rows=t.batch_size * d.group_size,
                     rollout_len=d.max_prompt_tokens + d.max_new_tokens,
                     cache_dtype=d.cache_dtype, engine=rollout_engine(d.engine), max_seqs=d.max_seqs)
    elif command == "dpo":
        if cfg.dpo.shared_prompt:  # one row [prompt | chosen | rejected] per pair
            row_len = head_len = 2 * length
        else:
            rows = 2 * t.batch_size
    elif command == "kto":
        rows = 2 * t.batch_size  # each example and its KL row
    elif command in ("grpo", "ppo"):
        section = getattr(cfg, command)
        rows, row_len, head_len = _rl_rows(section, t.batch_size)
        agent = cfg.agent.enabled  # episodes: on the paged engine, up to max_episode_tokens
        if agent:  # one row per episode, its slots after the opening scored (episode_rows)
            rows, row_len = t.batch_size, cfg.agent.max_episode_tokens
            head_len = row_len - section.max_prompt_tokens
        extra.update(rollout_rows=t.batch_size,
                     rollout_len=cfg.agent.max_episode_tokens if agent
                     else section.max_prompt_tokens + section.max_new_tokens,
                     cache_dtype=section.cache_dtype,
                     engine="paged" if agent else rollout_engine(section.engine), max_seqs=section.max_seqs,
                     staleness=section.max_staleness)
        if command == "grpo":
            extra["updates"] = section.iterations
        else:
            extra["critic"] = section.critic
    elif command == "distill":
        extra.update(teacher=teacher or preset(cfg.teacher.source),
                     teacher_dtype=cfg.teacher.dtype)
    return PlanInput(
        command=command, arch=arch, param_dtype=cfg.model.dtype, precision=t.precision,
        lora_rank=lora.rank, lora_targets=lora.targets, quantize=lora.quantize,
        train_layers=cfg.model.train_layers, remat=t.remat,
        scan=scan_setting(t.scan_layers, t.remat), head_chunk=t.head_chunk,
        attention=cfg.model.attention, rows=rows, row_len=row_len, head_len=head_len,
        grad_accum=t.grad_accum, data=mesh["data"], fsdp=mesh["fsdp"], tp=mesh["tp"],
        seq=mesh["seq"], vision_params=vision_params, vision_frozen=cfg.model.vision.freeze,
        **extra)
