"""Bytes of everything the planner counts per parameter: the trained weights, their gradients
and Adam moments, the frozen base (plain or NF4/int8-quantized), and the frozen copies a command
keeps beside the policy (DPO/KTO/GRPO/PPO reference, distillation teacher, PPO's critic).

What hone keeps (hone/train/step.py, hone/train/optimizer.py, hone/train/state.py):
- Parameters are stored in model.dtype; train.precision bf16 only casts them for the forward
  pass, so master weights, gradients and both Adam moments keep model.dtype (fp32 by default).
- Only the trainable parameters have gradients and moments (adapters with LoRA, the top
  blocks with model.train_layers). With grad_accum > 1 the step carries a gradient sum beside
  each micro-batch's gradients: two gradient trees.
- A "copy" reference holds the trainable parameters' starting values (all of them for full
  training, the adapters only with LoRA); adapters_off and precomputed hold none.
- Every weight is sharded over fsdp x tp (hone/parallel/rules.py: embed over fsdp; vocab, mlp
  and heads over tp); the norms are replicated, a rounding error here.
- QLoRA (hone/models/quant.py): a quantized kernel costs 0.5625 bytes per weight (nf4) or
  1.0625 (int8); the embedding and norms stay in model.dtype.
- A vision-language model's tower and connector (`vision_params`) train only under full
  fine-tuning without model.vision.freeze; otherwise they are frozen base weights.
"""

from __future__ import annotations

import re

from hone.models.config import ModelConfig
from hone.plan.inputs import PlanInput, param_bytes

QUANT_BYTES = {"nf4": 0.5625, "int8": 1.0625}


def linear_shapes(arch: ModelConfig, layer: int) -> dict[str, tuple[int, int]]:
    """The (in, out) widths of block `layer`'s dense projections, keyed by module path (the
    names model.lora.targets matches). Routed MLPs' experts are stacked, not Linear modules:
    only their attention projections are listed."""
    d, f, n, k, h = (arch.hidden_size, arch.intermediate_size, arch.num_heads,
                     arch.num_kv_heads, arch.head_dim)
    pre = f"layers/{layer}"
    out = {f"{pre}/attn/q": (d, n * h), f"{pre}/attn/k": (d, k * h),
           f"{pre}/attn/v": (d, k * h), f"{pre}/attn/o": (n * h, d)}
    if not arch.routed(layer):
        out.update({f"{pre}/mlp/gate": (d, f), f"{pre}/mlp/up": (d, f),
                    f"{pre}/mlp/down": (f, d)})
    return out


def block_params(arch: ModelConfig, layer: int) -> int:
    """Parameters of one transformer block (ModelConfig.num_params' per-layer term)."""
    from dataclasses import replace
    routed = replace(arch.moe, mlp_only_layers=(), decoder_sparse_step=1) \
        if arch.routed(layer) else None
    one = arch.replace(num_layers=1, layer_types=(arch.layer_types[layer],), moe=routed)
    return one.num_params() - one.replace(num_layers=0, layer_types=()).num_params()


def targeted(p: PlanInput, layer: int) -> dict[str, tuple[int, int]]:
    pattern = re.compile(p.lora_targets)
    return {name: io for name, io in linear_shapes(p.arch, layer).items()
            if pattern.fullmatch(name)}


def lora_params(p: PlanInput, layers=None) -> int:
    """Adapter parameters: rank x (in + out) per targeted projection."""
    if p.lora_rank == 0:
        return 0
    layers = range(p.arch.num_layers) if layers is None else layers
    return sum(p.lora_rank * (i + o) for layer in layers
               for i, o in targeted(p, layer).values())


def _top_layers(p: PlanInput) -> range:
    n = p.arch.num_layers
    return range(n - (p.train_layers or n), n)


def vision_trains(p: PlanInput) -> bool:
    """Whether a vision-language model's tower and connector train: under full fine-tuning of
    every block, unless model.vision.freeze (LoRA's default targets are the language model's;
    with train_layers they sit below every trained block: hone.train.build)."""
    return not (p.lora_rank or p.train_layers is not None or p.vision_frozen)


def trainable_params(p: PlanInput) -> int:
    """Parameters with gradients and optimizer state."""
    arch = p.arch
    if p.lora_rank:
        return lora_params(p, _top_layers(p))
    if p.train_layers is None:
        return arch.num_params() + (p.vision_params if vision_trains(p) else 0)
    above = arch.hidden_size + (0 if arch.tie_embeddings else arch.vocab_size * arch.hidden_size)
    return above + sum(block_params(arch, i) for i in _top_layers(p))


def frozen_bytes(p: PlanInput) -> float:
    """Bytes of the weights that do not train (whole model, unsharded): the base under
    adapters (quantized where the adapters' targets are), the lower blocks with train_layers."""
    arch, pb = p.arch, param_bytes(p)
    if not p.lora_rank:
        return (arch.num_params() + p.vision_params - trainable_params(p)) * pb
    total = (arch.num_params() + p.vision_params) * pb
    if p.quantize in QUANT_BYTES:
        kernels = sum(i * o for layer in range(arch.num_layers)
                      for i, o in targeted(p, layer).values())
        total -= kernels * (pb - QUANT_BYTES[p.quantize])
    return total


def weight_lines(p: PlanInput) -> dict[str, float]:
    """Per-device bytes of each per-parameter line (module docstring)."""
    shard = p.fsdp * p.tp
    pb = param_bytes(p)
    train = trainable_params(p) * pb
    lines = {
        "parameters (trained)": train / shard,
        "parameters (frozen base)": frozen_bytes(p) / shard,
        "gradients": train * (2 if p.grad_accum > 1 else 1) / shard,
        "optimizer state (Adam m, v)": 2 * train / shard,
        "reference copy": (train if p.reference == "copy" else 0) / shard,
    }
    if p.staleness:  # asynchronous RL: the versions the next rollouts read (hone.train.lagged)
        lines["policy versions kept (max_staleness)"] = p.staleness * train / shard
    if p.teacher is not None:
        tb = 2 if p.teacher_dtype == "bfloat16" else 4
        lines["teacher"] = p.teacher.num_params() * tb / shard
    if p.critic == "separate":  # a second model with a value head, trained: weights, grads, Adam
        lines["critic (weights, gradients, Adam)"] = 4 * p.arch.num_params() * pb / shard
    return lines


def transfer_bytes(p: PlanInput) -> float:
    """Bytes the trainer sends to rollout hosts after each update: the trained weights (the
    adapters alone under LoRA), in the storage dtype."""
    return trainable_params(p) * param_bytes(p)
