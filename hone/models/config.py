"""ModelConfig: the architecture of one decoder-only transformer, and the named presets.

Design choices:
- One config describes every supported family (Llama 3, SmolLM2, Qwen2/2.5, Qwen3, Gemma, Gemma 2,
  Gemma 3). A family is a set of flags, never a code path of its own (docs/architecture.md, design rule 2).
- Per-layer differences (sliding-window vs global attention, and the rotary base each uses) are a
  tuple with one entry per layer, so the model loops over layers without special cases.
- The config is a frozen dataclass: hashable, so it can be a static argument of a jitted function.
- Mixture-of-experts (Qwen3-MoE, Mixtral, Qwen2-MoE) is one more option: `moe` (a `MoE`) makes
  some blocks' MLPs routed (hone/models/moe.py); None is a dense model, exactly as before.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from hone.errors import InputError


@dataclass(frozen=True)
class RopeScaling:
    """Rotary-frequency scaling. kind "llama3" (Llama 3.1+) or "linear" (Gemma 3 global layers)."""

    kind: str = "llama3"  # "llama3" | "linear"
    factor: float = 8.0  # both kinds: how much longer the context is than in pre-training
    low_freq_factor: float = 1.0  # llama3: wavelengths above orig/low_freq_factor are divided by factor
    high_freq_factor: float = 4.0  # llama3: wavelengths below orig/high_freq_factor are unchanged
    original_max_position_embeddings: int = 8192  # llama3: pre-training context length


@dataclass(frozen=True)
class MoE:
    """A routed MLP: a router picks `num_experts_per_tok` of `num_experts` gated MLPs per token.
    Field names follow transformers' Qwen2-MoE/Qwen3-MoE configs (Mixtral: num_local_experts,
    intermediate_size)."""

    num_experts: int = 8  # E, experts per routed layer
    num_experts_per_tok: int = 2  # k, experts each token is sent to (top-k of the router)
    moe_intermediate_size: int = 128  # F of each expert's gated MLP
    # Divide the k chosen softmax weights by their sum (Qwen3-MoE: true; Mixtral: always;
    # Qwen2-MoE: false, the raw softmax probabilities weight the experts).
    norm_topk_prob: bool = True
    # Width of the shared expert every token also goes through, scaled by a sigmoid gate
    # (Qwen2-MoE); 0 = none.
    shared_expert_intermediate_size: int = 0
    # Layers (0-based) that keep a dense MLP of width intermediate_size.
    mlp_only_layers: tuple[int, ...] = ()
    # Layer i is routed when (i + 1) % decoder_sparse_step == 0 (and i is not mlp_only).
    decoder_sparse_step: int = 1


@dataclass(frozen=True)
class ModelConfig:
    """Architecture only: no weights, no training settings. Defaults describe a Llama-style model."""

    # HF model_type written on export: llama | qwen2 | qwen3 | gemma | gemma2 | gemma3_text, and
    # with `moe`: qwen3_moe | mixtral | qwen2_moe
    family: str = "llama"
    vocab_size: int = 32000  # V
    hidden_size: int = 512  # D, the residual width
    intermediate_size: int = 1376  # F, the MLP width
    num_layers: int = 4  # L
    num_heads: int = 8  # N, query heads
    num_kv_heads: int = 8  # K, key/value heads (grouped-query attention when K < N)
    head_dim: int = 64  # H
    max_position_embeddings: int = 2048  # the context length the model was trained for
    norm_eps: float = 1e-5  # RMSNorm epsilon
    rope_theta: float = 10000.0  # rotary base of global (full-attention) layers
    rope_local_theta: float | None = None  # rotary base of sliding-window layers (Gemma 3); None = rope_theta
    rope_scaling: RopeScaling | None = None  # applies to global layers only
    tie_embeddings: bool = False  # output projection reuses the input embedding matrix
    attention_bias: bool = False  # bias on the q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm over head_dim on queries and keys (Qwen3, Gemma 3)
    activation: str = "silu"  # gated-MLP activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU, Gemma)
    norm_offset: float = 0.0  # RMSNorm multiplies by (offset + weight); Gemma stores weight-1, offset 1
    embed_scale: bool = False  # multiply embeddings by sqrt(D) (Gemma)
    post_norms: bool = False  # extra RMSNorm after attention and after the MLP (Gemma 2, Gemma 3)
    query_pre_attn_scalar: float | None = None  # attention scale is this**-0.5; None = head_dim**-0.5
    attn_logit_softcap: float | None = None  # cap*tanh(scores/cap) before the softmax (Gemma 2)
    final_logit_softcap: float | None = None  # cap*tanh(logits/cap) on the output logits (Gemma 2)
    sliding_window: int | None = None  # keys at distance >= window are masked on sliding layers
    layer_types: tuple[str, ...] = field(default=())  # per layer "global" | "sliding"; () = all global
    moe: MoE | None = None  # routed MLPs (mixture of experts); None = every MLP dense

    def __post_init__(self):
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("global",) * self.num_layers)
        if len(self.layer_types) != self.num_layers:
            raise InputError(
                f"layer_types has {len(self.layer_types)} entries but num_layers is {self.num_layers}",
                key="layer_types")
        for t in self.layer_types:
            if t not in ("global", "sliding"):
                raise InputError(f"unknown layer type {t!r}; allowed: 'global', 'sliding'",
                                 key="layer_types")
        if "sliding" in self.layer_types and not self.sliding_window:
            raise InputError("sliding layers need a positive sliding_window", key="sliding_window")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"num_heads {self.num_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}", key="num_kv_heads")
        if self.activation not in ("silu", "gelu_tanh"):
            raise InputError(f"unknown activation {self.activation!r}; allowed: 'silu', 'gelu_tanh'",
                             key="activation")
        if self.head_dim % 2:
            raise InputError(f"head_dim must be even for rotary embeddings, got {self.head_dim}",
                             key="head_dim")
        m = self.moe
        if m is not None:
            if not 1 <= m.num_experts_per_tok <= m.num_experts:
                raise InputError(f"num_experts_per_tok {m.num_experts_per_tok} must lie in "
                                 f"[1, num_experts = {m.num_experts}]", key="num_experts_per_tok")
            if m.decoder_sparse_step < 1 or m.moe_intermediate_size < 1:
                raise InputError("decoder_sparse_step and moe_intermediate_size must be >= 1",
                                 key="decoder_sparse_step")
            object.__setattr__(self, "moe", dataclasses.replace(
                m, mlp_only_layers=tuple(sorted(set(m.mlp_only_layers)))))

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def routed(self, layer: int) -> bool:
        """Is block `layer`'s MLP routed? (transformers' rule for Qwen2/3-MoE; Mixtral: all.)"""
        m = self.moe
        return (m is not None and layer not in m.mlp_only_layers
                and (layer + 1) % m.decoder_sparse_step == 0)

    def num_params(self, active: bool = False) -> int:
        """Parameter count from the shapes alone (equals the model's; checked in tests).
        active: count only the k experts a token goes through in each routed MLP (what its
        forward pass multiplies), not all E."""
        d, f, n, k, h, v = (self.hidden_size, self.intermediate_size, self.num_heads,
                            self.num_kv_heads, self.head_dim, self.vocab_size)
        attn = d * n * h + 2 * d * k * h + n * h * d
        if self.attention_bias:
            attn += n * h + 2 * k * h
        if self.qk_norm:
            attn += 2 * h
        norms = (4 if self.post_norms else 2) * d
        total = v * d * (1 if self.tie_embeddings else 2) + d
        for i in range(self.num_layers):
            total += attn + norms + (self._routed_params(active) if self.routed(i) else 3 * d * f)
        return total

    def _routed_params(self, active: bool) -> int:
        """One routed MLP: router [D, E], experts 3 x [E, D, F_e] (k of them when active),
        shared expert 3 x D x F_s and its gate [D, 1]."""
        m, d = self.moe, self.hidden_size
        experts = m.num_experts_per_tok if active else m.num_experts
        count = d * m.num_experts + experts * 3 * d * m.moe_intermediate_size
        if m.shared_expert_intermediate_size:
            count += 3 * d * m.shared_expert_intermediate_size + d
        return count

    def matmul_params(self) -> int:
        """Weights that multiply: every parameter but the input embedding table (a gather),
        with the LM head counted once (tied: the table is that head). Routed MLPs count their
        active experts only (MFU counts the FLOPs a token costs)."""
        return self.num_params(active=True) - self.vocab_size * self.hidden_size * (
            0 if self.tie_embeddings else 1)

    def flops_per_token(self, seq_len: int) -> float:
        """Training FLOPs per token: 6 per matmul weight plus attention scores and values."""
        attn = 6 * 2 * self.num_layers * self.num_heads * self.head_dim * seq_len / 2
        return 6.0 * self.matmul_params() + attn


def _pattern(num_layers: int, every: int) -> tuple[str, ...]:
    """Gemma 2/3 layout: every `every`-th layer (1-based) is global, the others slide."""
    return tuple("global" if (i + 1) % every == 0 else "sliding" for i in range(num_layers))


def _llama(**kw) -> ModelConfig:
    return ModelConfig(family="llama", **kw)


def _qwen2(**kw) -> ModelConfig:
    return ModelConfig(family="qwen2", attention_bias=True, norm_eps=1e-6, rope_theta=1e6, **kw)


def _qwen3(**kw) -> ModelConfig:
    return ModelConfig(family="qwen3", qk_norm=True, norm_eps=1e-6, rope_theta=1e6,
                       max_position_embeddings=40960, head_dim=128, **kw)


def _qwen3_moe(**kw) -> ModelConfig:
    kw = dict(dict(max_position_embeddings=40960, head_dim=128), **kw)
    return ModelConfig(family="qwen3_moe", qk_norm=True, norm_eps=1e-6, rope_theta=1e6, **kw)


def _gemma_common(**kw) -> dict:
    return dict(activation="gelu_tanh", norm_offset=1.0, embed_scale=True, norm_eps=1e-6,
                tie_embeddings=True, vocab_size=kw.pop("vocab_size", 256000), **kw)


def _gemma2(num_layers: int, **kw) -> ModelConfig:
    return ModelConfig(**_gemma_common(
        family="gemma2", num_layers=num_layers, post_norms=True, attn_logit_softcap=50.0,
        final_logit_softcap=30.0, sliding_window=4096, max_position_embeddings=8192,
        layer_types=_pattern(num_layers, 2), **kw))


def _gemma3(num_layers: int, **kw) -> ModelConfig:
    return ModelConfig(**_gemma_common(
        family="gemma3_text", num_layers=num_layers, post_norms=True, qk_norm=True,
        vocab_size=262144, rope_theta=1e6, rope_local_theta=1e4, head_dim=256,
        query_pre_attn_scalar=256.0, sliding_window=kw.pop("sliding_window", 1024),
        layer_types=_pattern(num_layers, 6), **kw))


_LLAMA31_ROPE = RopeScaling("llama3", 8.0, 1.0, 4.0, 8192)
_LLAMA32_ROPE = RopeScaling("llama3", 32.0, 1.0, 4.0, 8192)

# Published sizes. Checked against transformers' own parameter counts in tests/models/test_presets.py.
PRESETS: dict[str, ModelConfig] = {
    "tiny": _llama(vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=16, max_position_embeddings=512, rope_theta=10000.0,
                   tie_embeddings=True),
    "llama3.2-1b": _llama(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_layers=16,
                          num_heads=32, num_kv_heads=8, head_dim=64, rope_theta=5e5,
                          max_position_embeddings=131072, tie_embeddings=True,
                          rope_scaling=_LLAMA32_ROPE),
    "llama3.2-3b": _llama(vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_layers=28,
                          num_heads=24, num_kv_heads=8, head_dim=128, rope_theta=5e5,
                          max_position_embeddings=131072, tie_embeddings=True,
                          rope_scaling=_LLAMA32_ROPE),
    "llama3.1-8b": _llama(vocab_size=128256, hidden_size=4096, intermediate_size=14336,
                          num_layers=32, num_heads=32, num_kv_heads=8, head_dim=128, rope_theta=5e5,
                          max_position_embeddings=131072, rope_scaling=_LLAMA31_ROPE),
    "smollm2-135m": _llama(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_layers=30,
                           num_heads=9, num_kv_heads=3, head_dim=64, rope_theta=1e5,
                           max_position_embeddings=8192, tie_embeddings=True),
    "smollm2-360m": _llama(vocab_size=49152, hidden_size=960, intermediate_size=2560, num_layers=32,
                           num_heads=15, num_kv_heads=5, head_dim=64, rope_theta=1e5,
                           max_position_embeddings=8192, tie_embeddings=True),
    "smollm2-1.7b": _llama(vocab_size=49152, hidden_size=2048, intermediate_size=8192,
                           num_layers=24, num_heads=32, num_kv_heads=32, head_dim=64,
                           rope_theta=1.3e5, max_position_embeddings=8192, tie_embeddings=True),
    "qwen2.5-0.5b": _qwen2(vocab_size=151936, hidden_size=896, intermediate_size=4864,
                           num_layers=24, num_heads=14, num_kv_heads=2, head_dim=64,
                           max_position_embeddings=32768, tie_embeddings=True),
    "qwen2.5-1.5b": _qwen2(vocab_size=151936, hidden_size=1536, intermediate_size=8960,
                           num_layers=28, num_heads=12, num_kv_heads=2, head_dim=128,
                           max_position_embeddings=32768, tie_embeddings=True),
    "qwen2.5-7b": _qwen2(vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                         num_layers=28, num_heads=28, num_kv_heads=4, head_dim=128,
                         max_position_embeddings=32768),
    "qwen3-0.6b": _qwen3(vocab_size=151936, hidden_size=1024, intermediate_size=3072,
                         num_layers=28, num_heads=16, num_kv_heads=8, tie_embeddings=True),
    "qwen3-1.7b": _qwen3(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                         num_layers=28, num_heads=16, num_kv_heads=8, tie_embeddings=True),
    "qwen3-4b": _qwen3(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                       num_layers=36, num_heads=32, num_kv_heads=8, tie_embeddings=True),
    "qwen3-8b": _qwen3(vocab_size=151936, hidden_size=4096, intermediate_size=12288,
                       num_layers=36, num_heads=32, num_kv_heads=8),
    "gemma-2b": ModelConfig(**_gemma_common(
        family="gemma", hidden_size=2048, intermediate_size=16384, num_layers=18, num_heads=8,
        num_kv_heads=1, head_dim=256, max_position_embeddings=8192)),
    "gemma2-2b": _gemma2(26, hidden_size=2304, intermediate_size=9216, num_heads=8,
                         num_kv_heads=4, head_dim=256, query_pre_attn_scalar=256.0),
    "gemma2-9b": _gemma2(42, hidden_size=3584, intermediate_size=14336, num_heads=16,
                         num_kv_heads=8, head_dim=256, query_pre_attn_scalar=256.0),
    "gemma3-270m": _gemma3(18, hidden_size=640, intermediate_size=2048, num_heads=4,
                           num_kv_heads=1, sliding_window=512, max_position_embeddings=32768),
    "gemma3-1b": _gemma3(26, hidden_size=1152, intermediate_size=6912, num_heads=4,
                         num_kv_heads=1, sliding_window=512, max_position_embeddings=32768),
    "gemma3-4b": _gemma3(34, hidden_size=2560, intermediate_size=10240, num_heads=8,
                         num_kv_heads=4, max_position_embeddings=131072,
                         rope_scaling=RopeScaling("linear", factor=8.0)),
    # Mixture of experts: sizes from each model's published config.json.
    "tiny-moe": _qwen3_moe(vocab_size=264, hidden_size=64, intermediate_size=128, num_layers=2,
                           num_heads=4, num_kv_heads=2, head_dim=16, max_position_embeddings=512,
                           tie_embeddings=True,
                           moe=MoE(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32)),
    "qwen3-30b-a3b": _qwen3_moe(vocab_size=151936, hidden_size=2048, intermediate_size=6144,
                                num_layers=48, num_heads=32, num_kv_heads=4,
                                moe=MoE(num_experts=128, num_experts_per_tok=8,
                                        moe_intermediate_size=768)),
    "mixtral-8x7b": ModelConfig(family="mixtral", vocab_size=32000, hidden_size=4096,
                                intermediate_size=14336, num_layers=32, num_heads=32,
                                num_kv_heads=8, head_dim=128, max_position_embeddings=32768,
                                rope_theta=1e6, moe=MoE(num_experts=8, num_experts_per_tok=2,
                                                        moe_intermediate_size=14336)),
    "qwen1.5-moe-a2.7b": ModelConfig(
        family="qwen2_moe", attention_bias=True, norm_eps=1e-6, rope_theta=1e6,
        vocab_size=151936, hidden_size=2048, intermediate_size=5632, num_layers=24, num_heads=16,
        num_kv_heads=16, head_dim=128, max_position_embeddings=8192,
        moe=MoE(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=1408,
                norm_topk_prob=False, shared_expert_intermediate_size=5632)),
}


def preset(name: str) -> ModelConfig:
    """The architecture of a named preset (random-init shapes; no weights)."""
    if name not in PRESETS:
        raise InputError(f"unknown model preset {name!r}; known: {', '.join(sorted(PRESETS))}",
                         key="model.source")
    return PRESETS[name]
