"""LoRA adapters (and QLoRA's quantized base) on hone's own `Linear`.

Design choices:
- Written here rather than taken from qwix: every projection in hone is one `Linear`, so an
  adapter is two extra matrices and one extra line in `Linear.__call__`; and export to PEFT
  (hone/weights/peft.py) must map adapters to Hugging Face module names through hone's own name
  table, which qwix's generic interception cannot know. qwix also keeps 4-bit codes one per byte
  on CPU (about 1.06 bytes per weight), where hone packs two per byte (quant.py).
- Adapters are `LoRAParam` variables (a subclass of `nnx.Param`): `nnx.state(model, LoRAParam)`
  is the trainable set; the frozen base is every other `nnx.Param` (or `QuantizedKernel` storage
  when quantized, which no parameter filter sees). Note that a plain `nnx.Param` filter also
  matches adapters: filter the frozen base with `nnx.All(nnx.Param, nnx.Not(LoRAParam))`.
- Shapes: A [in_features, r], B [r, out_features] on the flattened 2-D view of the kernel, which
  is also the layout Hugging Face Linear layers use (transposed), so export is a transpose.
  Logical axis names: A (outermost input axis name, "lora_rank"), B ("lora_rank", outermost
  output axis name), e.g. q: A ("embed", "lora_rank"), B ("lora_rank", "heads"). The flattened
  axis takes its outermost axis's name because splitting the flattened axis into m contiguous
  shards is exactly splitting that outermost axis into m shards whenever m divides it.
- y = x @ W + (dropout(x) @ A @ B) * alpha / r, B zero at the start (the model is unchanged),
  A uniform in +-1/sqrt(in_features) (PEFT's kaiming_uniform(a=sqrt(5)) for a [r, in] weight).
- Dropout draws from one RNG stream shared by every adapter (a single key/count in the state).
  It is off by default (`deterministic=True`) so sampling never drops; training turns it on with
  `model.train()` or `nnx.view(model, deterministic=False)`. Under `nnx.jit` the stream advances
  by itself; a step that splits the model and passes the stream's state in without returning it
  must reseed it each step: `nnx.reseed(model, dropout=step_key)` (else every step repeats the
  same masks). With dropout 0 there is no stream at all.
- Module paths are the "/"-joined nnx paths of each Linear: "layers/3/attn/q", "layers/0/mlp/down",
  "lm_head" (only for untied output embeddings). `targets` is a regex `re.fullmatch`ed to them.
- Routed experts (hone/models/moe.py) are stacked [E, I, O] parameters, not Linears: their
  paths are "layers/0/mlp/experts/gate" (also up, down), which the default targets do not
  match (a mixture-of-experts model's default adapters are attention's, and a dense layer's
  MLP's). Named, they get `ExpertLoRA`, one adapter per expert stacked (A [E, I, r],
  B [E, r, O]), applied inside the grouped compute; under QLoRA the stacked weights are stored
  NF4/int8, each expert's matrix quantized as a Linear's would be. A shared expert is a plain
  gated MLP: "layers/0/mlp/shared/gate".
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
from flax import nnx

from hone.errors import InputError
from hone.models import grouped
from hone.models.linear import Linear
from hone.models.matmul import low_rank
from hone.models.moe import AXES, PROJECTIONS, ExpertParts, RoutedMLP
from hone.models.quant import KINDS as QUANT_KINDS
from hone.models.quant import QuantizedWeight


class LoRAParam(nnx.Param):
    """A LoRA adapter matrix: the only trainable parameters of an adapted model."""


class LoRA(nnx.Module):
    """The low-rank update of one Linear: x [..., I] -> dropout(x) @ A @ B * alpha / r [..., O]."""

    def __init__(self, in_features: int, out_features: int, names: tuple[str, str], *,
                 rank: int, alpha: float, dropout: float, dtype, key: jax.Array,
                 dropout_rngs: nnx.RngStream | None):
        bound = 1.0 / math.sqrt(in_features)
        a = jax.random.uniform(key, (in_features, rank), jnp.float32, -bound, bound)
        self.lora_a = LoRAParam(a.astype(dtype), out_sharding=(names[0], "lora_rank"),
                                eager_sharding=False)
        self.lora_b = LoRAParam(jnp.zeros((rank, out_features), dtype),
                                out_sharding=("lora_rank", names[1]), eager_sharding=False)
        self.rank, self.alpha, self.dropout_rate = rank, alpha, dropout
        self.scale = alpha / rank
        if dropout > 0:
            self.dropout = nnx.Dropout(dropout, deterministic=True)
            self.dropout_rngs = dropout_rngs  # shared by every adapter of the model
        else:
            self.dropout = self.dropout_rngs = None

    def __call__(self, x: jax.Array) -> jax.Array:
        if self.dropout is not None:
            x = self.dropout(x, rngs=self.dropout_rngs)
        return low_rank(x, self.lora_a[...], self.lora_b[...], self.scale)

    def delta(self) -> jax.Array:
        """The update as a float32 [I, O] matrix: A @ B * alpha / r."""
        a = self.lora_a[...].astype(jnp.float32)
        return jnp.dot(a, self.lora_b[...].astype(jnp.float32)) * self.scale


class ExpertLoRA(nnx.Module):
    """The low-rank updates of a stacked expert projection [E, I, O], one adapter per expert:
    A [E, I, r], B [E, r, O]; a row of expert e gets dropout(x) @ A[e] @ B[e] * alpha / r,
    through the same grouped products as the experts' weights (hone/models/grouped.py)."""

    def __init__(self, experts: int, in_features: int, out_features: int,
                 names: tuple[str, str, str], *, rank: int, alpha: float, dropout: float, dtype,
                 key: jax.Array, dropout_rngs: nnx.RngStream | None):
        bound = 1.0 / math.sqrt(in_features)  # as LoRA's, per expert
        a = jax.random.uniform(key, (experts, in_features, rank), jnp.float32, -bound, bound)
        self.lora_a = LoRAParam(a.astype(dtype), out_sharding=(names[0], names[1], "lora_rank"),
                                eager_sharding=False)
        self.lora_b = LoRAParam(jnp.zeros((experts, rank, out_features), dtype),
                                out_sharding=(names[0], "lora_rank", names[2]),
                                eager_sharding=False)
        self.rank, self.alpha, self.dropout_rate = rank, alpha, dropout
        self.scale = alpha / rank
        if dropout > 0:
            self.dropout = nnx.Dropout(dropout, deterministic=True)
            self.dropout_rngs = dropout_rngs
        else:
            self.dropout = self.dropout_rngs = None

    def __call__(self, rows: jax.Array, lay: grouped.Layout) -> jax.Array:
        """rows [R, I] of the grouped layout -> their updates [R, O]."""
        if self.dropout is not None:
            rows = self.dropout(rows, rngs=self.dropout_rngs)
        h = grouped.gmm(rows, self.lora_a[...].astype(rows.dtype), lay)  # [R, r]
        return grouped.gmm(h * jnp.asarray(self.scale, h.dtype),
                           self.lora_b[...].astype(rows.dtype), lay)  # [R, O]

    def delta(self) -> jax.Array:
        """The updates as float32 [E, I, O]: A[e] @ B[e] * alpha / r."""
        a, b = (x[...].astype(jnp.float32) for x in (self.lora_a, self.lora_b))
        return jnp.einsum("EIR,ERO->EIO", a, b) * self.scale


def expert_projections(model: nnx.Module) -> dict[str, tuple[RoutedMLP, str]]:
    """Every routed MLP's stacked expert projections by path, "layers/0/mlp/experts/gate"
    (the default targets, "mlp/(gate|up|down)", do not name them), -> (the RoutedMLP, "gate")."""
    out = {}
    for path, m in nnx.iter_modules(model):
        if isinstance(m, RoutedMLP):
            for name in PROJECTIONS:
                out["/".join(str(p) for p in path) + "/experts/" + name] = (m, name)
    return out


def expert_lora_modules(model: nnx.Module) -> dict[str, tuple[RoutedMLP, str]]:
    """The expert projections that carry adapters, by path."""
    return {p: (m, name) for p, (m, name) in expert_projections(model).items()
            if m.adapter(name) is not None}


def linears(model: nnx.Module) -> dict[str, Linear]:
    """Every Linear of the model by "/"-joined module path ("layers/0/attn/q", "lm_head")."""
    return {"/".join(str(p) for p in path): m
            for path, m in nnx.iter_modules(model) if isinstance(m, Linear)}


def lora_modules(model: nnx.Module) -> dict[str, Linear]:
    """The Linears that carry adapters, by module path."""
    return {p: m for p, m in linears(model).items() if m.lora is not None}


def _axis_names(lin: Linear) -> tuple[str, str]:
    """Names of the flattened input and output axes: their outermost axes' names."""
    return lin.names[0], lin.names[len(lin.in_shape)]


def apply_lora(model: nnx.Module, *, rank: int, alpha: float, targets: str,
               dropout: float = 0.0, quantize: str = "none", rngs: nnx.Rngs,
               dtype=None) -> nnx.Module:
    """Attach LoRA adapters to every Linear whose module path `re.fullmatch`es `targets`.

    In place; returns the model. quantize: "none", "nf4" or "int8": store the targeted Linears'
    frozen kernels quantized (QLoRA). dtype: the adapters' dtype (default: each base kernel's).
    rngs: draws the A initialisations ("params" stream) and, if dropout > 0, the dropout stream.
    Raises InputError (key "model.lora.*") for a bad setting or a regex that matches nothing.
    """
    if not (isinstance(rank, int) and rank > 0):
        raise InputError(f"rank must be a positive integer, got {rank!r}", key="model.lora.rank")
    if not 0.0 <= dropout < 1.0:
        raise InputError(f"dropout must be in [0, 1), got {dropout!r}", key="model.lora.dropout")
    if quantize not in ("none",) + QUANT_KINDS:
        raise InputError(f"quantize must be one of none, {', '.join(QUANT_KINDS)}; got "
                         f"{quantize!r}", key="model.lora.quantize")
    try:
        pattern = re.compile(targets)
    except re.error as e:
        raise InputError(f"not a valid regular expression ({e})",
                         key="model.lora.targets") from None
    every = linears(model)
    chosen = {p: m for p, m in every.items() if pattern.fullmatch(p)}
    stacks = expert_projections(model)
    chosen_stacks = {p: v for p, v in stacks.items() if pattern.fullmatch(p)}
    if not chosen and not chosen_stacks:
        examples = ", ".join(list(every)[:4] + list(stacks)[:1])
        raise InputError(f"{targets!r} matches no projection; module paths look like "
                         f"{examples} (the regex must match a whole path)",
                         key="model.lora.targets")
    already = ([p for p, m in chosen.items() if m.lora is not None]
               + [p for p, (m, name) in chosen_stacks.items() if m.adapter(name) is not None])
    if already:
        raise InputError(f"{already[0]} already has LoRA adapters", key="model.lora.targets")
    dropout_rngs = rngs["dropout"].fork() if dropout > 0 else None
    for lin in chosen.values():
        names = _axis_names(lin)
        base_dtype = lin.quant.dtype if lin.quant is not None else lin.kernel.dtype
        lin.lora = LoRA(lin.in_features, lin.out_features, names, rank=rank, alpha=alpha,
                        dropout=dropout, dtype=dtype or base_dtype, key=rngs.params(),
                        dropout_rngs=dropout_rngs)
        if quantize != "none" and lin.quant is None:
            lin.quant = QuantizedWeight(lin.weight(), quantize, names)
            lin.kernel = None
    for mlp, name in chosen_stacks.values():
        w = mlp.weight(name)  # [E, I, O] array, or already quantized storage
        if mlp.lora is None:
            mlp.lora = ExpertParts()
        setattr(mlp.lora, name, ExpertLoRA(
            *w.shape, AXES[name], rank=rank, alpha=alpha, dropout=dropout,
            dtype=dtype or w.dtype, key=rngs.params(), dropout_rngs=dropout_rngs))
        if quantize != "none" and isinstance(w, jax.Array):
            if mlp.quant is None:
                mlp.quant = ExpertParts()
            setattr(mlp.quant, name, QuantizedWeight(w, quantize, AXES[name]))
            setattr(mlp, name, None)
    return model


def merge_lora(model: nnx.Module) -> nnx.Module:
    """A plain copy of the model: W + A @ B * alpha / r folded into each kernel (dequantized
    first where the base is quantized), no adapters. The adapted model is left as it was."""
    merged = nnx.clone(model)
    for lin in linears(merged).values():
        if lin.lora is None and lin.quant is None:
            continue
        if lin.quant is not None:
            dtype, w = lin.quant.dtype, lin.quant.dequantize(jnp.float32)
        else:
            dtype, w = lin.kernel.dtype, lin.weight().astype(jnp.float32)
        if lin.lora is not None:
            w = w + lin.lora.delta()
        kernel = w.astype(dtype).reshape(lin.in_shape + lin.out_shape)
        lin.kernel = nnx.Param(kernel, out_sharding=lin.names, eager_sharding=False)
        lin.quant = lin.lora = None
    for _, m in nnx.iter_modules(merged):
        if isinstance(m, RoutedMLP) and (m.lora is not None or m.quant is not None):
            for name in PROJECTIONS:  # W + A @ B * alpha / r per expert, dequantized first
                setattr(m, name, nnx.Param(m.folded(name), out_sharding=AXES[name],
                                           eager_sharding=False))
            m.lora = m.quant = None
    return merged


def lora_state(model: nnx.Module) -> nnx.State:
    """The adapter matrices only (an nnx.State of LoRAParam; `nnx.update(model, s)` loads one)."""
    return nnx.state(model, LoRAParam)
