"""The routed MLP of mixture-of-experts blocks (Qwen3-MoE, Mixtral, Qwen2-MoE).

y = sum over the k experts a token's router picks of weight * expert(x), plus (Qwen2-MoE)
sigmoid(shared_gate(x)) * shared_expert(x). Design choices:

- Router: a [D, E] weight whose logits are computed in float32 whatever the weights' dtype
  (routing decisions are discrete, and bf16 logits flip near ties); softmax, top-k, and the k
  weights renormalised to sum to one when the family does (norm_topk_prob).
- Experts are stored stacked, gate/up [E, D, F] and down [E, F, D] (the logical axis `expert`
  leads), so one product runs all experts and a mesh can later split the expert axis.
- Dropless grouped compute (`grouped_experts`): the N*k (token, expert) pairs are sorted by
  expert and every product of the expert MLP runs on those rows, one expert's matrix per group
  (hone/models/grouped.py): `jax.lax.ragged_dot` on GPU/TPU; on CPU, whose XLA lowers
  ragged_dot to a masked product over every expert, a loop over row tiles whose work follows
  the chosen experts; the same loop wherever there are fewer pairs than experts (decode), so
  a decode step reads only the chosen experts' weights. No capacity, no dropped token.
- Attachments (hone/models/lora.py): LoRA adapters per expert (`lora`, stacked like the
  weights) and QLoRA's quantized expert storage (`quant`), one slot per projection
  (`ExpertParts`); both run inside the grouped products.
- `dense_experts` runs every expert on every token and weights by the same sparse top-k
  weights: the reference the grouped path is tested against (`RoutedMLP.grouped = False`).
- What the router did leaves the block as (logits, chosen) for the router losses
  (hone/losses/moe.py); the transformer reduces them to per-layer sums (see
  `Transformer.router_loss`).

Letters: N tokens (B*T flattened), E experts, k experts per token, F expert width, D hidden.
"""

from __future__ import annotations

from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx

from hone.models import grouped
from hone.models.config import ModelConfig
from hone.models.layers import param
from hone.models.linear import Linear
from hone.models.mlp import GatedMLP, activate


@dataclass(frozen=True)
class RouterLoss:
    """The router-loss coefficients a training run adds (model.moe in the config); static on
    the Transformer, like remat."""

    aux_coef: float = 0.001  # load-balancing loss (Switch/Mixtral form)
    z_coef: float = 0.0  # router z-loss


def route(logits: jax.Array, k: int, renormalize: bool) -> tuple[jax.Array, jax.Array]:
    """Router logits [N, E] (float32) -> (weights [N, k] float32, chosen [N, k] int32): the
    top-k softmax probabilities, divided by their sum when `renormalize`."""
    probs = jax.nn.softmax(logits, axis=-1)  # [N, E]
    weights, chosen = jax.lax.top_k(probs, k)  # [N, k], [N, k]
    if renormalize:
        weights = weights / jnp.sum(weights, axis=-1, keepdims=True)
    return weights, chosen.astype(jnp.int32)


def grouped_experts(x: jax.Array, chosen: jax.Array, weights: jax.Array, gate, up, down,
                    activation: str, adapters=(None, None, None),
                    method: str | None = None) -> jax.Array:
    """sum_j weights[n, j] * expert_{chosen[n, j]}(x[n]) for every token, computing each
    (token, expert) pair once. x [N, D], chosen/weights [N, k], gate/up [E, D, F],
    down [E, F, D] (arrays, or frozen QuantizedWeight storage of those shapes) -> [N, D] in
    x's dtype. adapters: LoRA of gate, up, down (lora.ExpertLoRA) or None each. method:
    "ragged" or "tiles" (hone/models/grouped.py); default: tiles on CPU, and wherever there
    are fewer pairs than experts (decode), else ragged."""
    n, k = chosen.shape
    e = gate.shape[0]
    if method is None:
        method = "tiles" if n * k < e else grouped.default_method()
    lay = grouped.layout(chosen, e, method)
    xs = grouped.gather_rows(x, lay)  # [R, D] each pair's token, sorted by expert

    def project(rows, w, adapter):  # [R, I] -> [R, O]
        y = grouped.gmm(rows, w, lay)
        return y if adapter is None else y + adapter(rows, lay).astype(y.dtype)

    h = activate(project(xs, gate, adapters[0]), activation) * project(
        xs, up, adapters[1])  # [R, F]
    ys = grouped.scatter_rows(project(h, down, adapters[2]), lay)  # [N*k, D] (token, slot)
    ys = ys.reshape(n, k, -1).astype(jnp.float32)  # [N, k, D]
    return jnp.sum(ys * weights[..., None], axis=1).astype(x.dtype)


def dense_experts(x: jax.Array, chosen: jax.Array, weights: jax.Array, gate: jax.Array,
                  up: jax.Array, down: jax.Array, activation: str) -> jax.Array:
    """The same sum from every expert on every token (E times the work): the reference."""
    e = gate.shape[0]
    h = activate(jnp.einsum("ND,EDF->ENF", x, gate), activation) * jnp.einsum(
        "ND,EDF->ENF", x, up)  # [E, N, F]
    ys = jnp.einsum("ENF,EFD->END", h, down).astype(jnp.float32)  # [E, N, D]
    dense = jnp.sum(jax.nn.one_hot(chosen, e, dtype=jnp.float32) * weights[..., None],
                    axis=1)  # [N, E], zero off the top-k
    return jnp.einsum("NE,END->ND", dense, ys).astype(x.dtype)


PROJECTIONS = ("gate", "up", "down")  # the stacked expert projections, in order
# Logical axis names of each stacked projection [E, I, O].
AXES = {"gate": ("expert", "embed", "mlp"), "up": ("expert", "embed", "mlp"),
        "down": ("expert", "mlp", "embed")}


class ExpertParts(nnx.Module):
    """One attachment per stacked expert projection: LoRA adapters (lora.ExpertLoRA) or frozen
    quantized storage (quant.QuantizedWeight), None where the projection has none."""

    def __init__(self):
        self.gate = nnx.data(None)
        self.up = nnx.data(None)
        self.down = nnx.data(None)


class RoutedMLP(nnx.Module):
    """x [B, T, D] -> y [B, T, D]: a router, E stacked gated-MLP experts, an optional shared
    expert with a sigmoid gate."""

    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs):
        m = cfg.moe
        d, e, f = cfg.hidden_size, m.num_experts, m.moe_intermediate_size
        self.top_k = m.num_experts_per_tok
        self.renormalize = m.norm_topk_prob
        self.activation = cfg.activation
        self.router = param(rngs, (d, e), ("embed", "expert"), dtype)  # [D, E]
        self.gate = param(rngs, (e, d, f), AXES["gate"], dtype)  # [E, D, F]
        self.up = param(rngs, (e, d, f), AXES["up"], dtype)  # [E, D, F]
        self.down = param(rngs, (e, f, d), AXES["down"], dtype)  # [E, F, D]
        width = m.shared_expert_intermediate_size
        self.shared = GatedMLP(cfg, dtype, rngs, width) if width else None
        self.shared_gate = (Linear((d,), (1,), ("embed", "score"), dtype, rngs) if width
                            else None)
        # Attached by hone/models/lora.py (model.lora.targets naming "mlp/experts/..."): the
        # experts' adapters, and under QLoRA their frozen quantized storage (the projection's
        # Param is then None, as a quantized Linear's kernel is).
        self.lora: ExpertParts | None = nnx.data(None)
        self.quant: ExpertParts | None = nnx.data(None)
        # True: the grouped (dropless, sorted) compute; False: every expert on every token,
        # the reference tests compare against. Static.
        self.grouped = True
        # The grouped compute's method: None (tiles on CPU, ragged_dot elsewhere; see
        # grouped_experts), "ragged" or "tiles". Static; tests and benchmarks set it.
        self.method: str | None = None

    def weight(self, name: str):
        """Projection `name`'s stacked base weights: the [E, I, O] array, or its
        QuantizedWeight storage under QLoRA."""
        stored = getattr(self.quant, name) if self.quant is not None else None
        return stored if stored is not None else getattr(self, name)[...]

    def adapter(self, name: str):
        """Projection `name`'s LoRA adapters (lora.ExpertLoRA) or None."""
        return getattr(self.lora, name) if self.lora is not None else None

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.forward(x)[0]

    def forward(self, x: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        """(y [B, T, D], router logits [N, E] float32, chosen experts [N, k])."""
        b, t, d = x.shape
        x2 = x.reshape(b * t, d)  # [N, D]
        logits = jnp.einsum("ND,DE->NE", x2.astype(jnp.float32),
                            self.router[...].astype(jnp.float32))  # [N, E]
        weights, chosen = route(logits, self.top_k, self.renormalize)  # [N, k] each
        if self.grouped:
            y = grouped_experts(x2, chosen, weights, *map(self.weight, PROJECTIONS),
                                self.activation, tuple(map(self.adapter, PROJECTIONS)),
                                self.method)  # [N, D]
        else:  # the reference: adapters folded into the weights
            y = dense_experts(x2, chosen, weights, *map(self.folded, PROJECTIONS),
                              self.activation)  # [N, D]
        if self.shared is not None:
            gate = jax.nn.sigmoid(self.shared_gate(x2).astype(jnp.float32))  # [N, 1]
            y = (y.astype(jnp.float32) + gate * self.shared(x2).astype(jnp.float32)).astype(
                x.dtype)
        return y.reshape(b, t, d), logits, chosen

    def folded(self, name: str) -> jax.Array:
        """W + A @ B * alpha / r (dequantized first), [E, I, O] in the base weights' dtype."""
        w = self.weight(name)
        dtype = w.dtype
        w = w.dequantize(jnp.float32) if hasattr(w, "dequantize") else w.astype(jnp.float32)
        adapter = self.adapter(name)
        return (w if adapter is None else w + adapter.delta()).astype(dtype)
