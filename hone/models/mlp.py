"""The gated MLP: down(act(gate(x)) * up(x)), SwiGLU with silu, GeGLU with tanh-gelu (Gemma)."""

from __future__ import annotations

import jax
from flax import nnx

from hone.kernels import packed as packed_kernel
from hone.models.config import ModelConfig
from hone.models.linear import Linear


class GatedMLP(nnx.Module):
    def __init__(self, cfg: ModelConfig, dtype, rngs: nnx.Rngs, width: int | None = None):
        # width: F, default intermediate_size (a routed MLP's shared expert has its own)
        d, f = cfg.hidden_size, width or cfg.intermediate_size
        self.gate = Linear((d,), (f,), ("embed", "mlp"), dtype, rngs)
        self.up = Linear((d,), (f,), ("embed", "mlp"), dtype, rngs)
        self.down = Linear((f,), (d,), ("mlp", "embed"), dtype, rngs)
        self.activation = cfg.activation
        # gate and up's weights in pairs of column panels: set by the sampler's decode step only
        # (hone/sampling/engine.py), one kernel call for act(gate(x)) * up(x).
        self.packed_gate_up: jax.Array | None = nnx.data(None)

    def __call__(self, x: jax.Array) -> jax.Array:  # [B, T, D] -> [B, T, D]
        if self.packed_gate_up is not None:
            hidden = packed_kernel.gated(x, self.packed_gate_up, self.gate.out_features,
                                         self.activation)
            return self.down(hidden.astype(x.dtype))
        gate = self.gate(x)  # [B, T, F]
        return self.down(activate(gate, self.activation) * self.up(x))


def activate(gate: jax.Array, activation: str) -> jax.Array:
    """The gated MLP's nonlinearity: silu (SwiGLU) or tanh-approximated gelu (GeGLU)."""
    if activation == "silu":
        return jax.nn.silu(gate)
    return jax.nn.gelu(gate, approximate=True)
