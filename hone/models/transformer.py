"""The one decoder-only transformer behind every family (Llama 3, SmolLM2, Qwen2/3, Gemma 1/2/3).

Family quirks are ModelConfig flags: attention bias, q/k norm, GeGLU, norm offset, embedding
scale, post-norms, soft-capping, sliding-window layers with their own rotary base, tied output,
and routed (mixture-of-experts) MLPs in some blocks (Qwen3-MoE, Mixtral, Qwen2-MoE;
hone/models/moe.py). What the routers did leaves a training forward pass as per-layer sums
kept in an nnx intermediate on the Transformer (`router_loss`, `pop_router_sums`): blocks
return them through the loop and the scan alike, and the train step adds the router losses.
Layers are a Python list so per-layer differences, adapters and intermediate activations stay
simple; with `scan_layers` the forward pass runs them as a scan over their weights, stored
stacked by the train state (hone/models/scan_layers.py, hone/models/stacked.py), which is what
lets remat bound the backward pass's memory and keeps the compiled step flat in depth.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from hone.losses.moe import RouterSums, router_sums
from hone.models.attention import Attention
from hone.models.blockwise import DEFAULT_BLOCK, SAVED as ATTENTION_SAVED
from hone.models.config import ModelConfig
from hone.models.layers import Embedder, RMSNorm, rope_inv_freq, rope_tables
from hone.models.layers import positions_from_mask
from hone.models.linear import Linear
from hone.models.masks import MaskSpec
from hone.models.mlp import GatedMLP
from hone.models.moe import RoutedMLP, RouterLoss
from hone.models.scan_layers import given_to, run_blocks, scannable


def remat_policy(name: str):
    """The jax.checkpoint policy of a remat setting (see Transformer.remat)."""
    policies = jax.checkpoint_policies
    if name == "full":
        return policies.nothing_saveable
    if name == "save_dots":
        return policies.dots_with_no_batch_dims_saveable
    if name == "save_attention":  # blockwise attention's output and statistics, by name
        return policies.save_only_these_names(*ATTENTION_SAVED)
    if name == "offload":
        return policies.offload_dot_with_no_batch_dims("device", "pinned_host")
    raise ValueError(f"unknown remat policy {name!r}")


class Block(nnx.Module):
    """Pre-norm residual block; Gemma 2/3 also normalise each sub-layer's output. The MLP is
    dense (GatedMLP) or, in mixture-of-experts layers, routed (RoutedMLP)."""

    def __init__(self, cfg: ModelConfig, layer_type: str, dtype, rngs: nnx.Rngs,
                 routed: bool = False):
        norm = lambda: RMSNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_offset, dtype)  # noqa: E731
        self.layer_type = layer_type
        self.attn_norm = norm()
        self.attn = Attention(cfg, dtype, rngs)
        self.mlp_norm = norm()
        self.mlp = RoutedMLP(cfg, dtype, rngs) if routed else GatedMLP(cfg, dtype, rngs)
        self.attn_post_norm = norm() if cfg.post_norms else None
        self.mlp_post_norm = norm() if cfg.post_norms else None

    def __call__(self, x: jax.Array, attend: Callable[[jax.Array], jax.Array]) -> jax.Array:
        """attend: normed hidden [B, T, D] -> attention output [B, T, D]. The caller chooses
        how keys are found (the sequence itself, or a KV cache); the block owns the rest."""
        return self.forward(x, attend)[0]

    def forward(self, x: jax.Array, attend: Callable[[jax.Array], jax.Array],
                valid: jax.Array | None = None) -> tuple[jax.Array, RouterSums | None]:
        """(the block's output, its router's sums over the tokens `valid` [B*T] marks): the
        sums only for a routed MLP given `valid`, else None (hone/losses/moe.py)."""
        h = attend(self.attn_norm(x))
        if self.attn_post_norm is not None:
            h = self.attn_post_norm(h)
        x = x + h
        sums = None
        if isinstance(self.mlp, RoutedMLP):
            h, logits, chosen = self.mlp.forward(self.mlp_norm(x))
            if valid is not None:
                sums = router_sums(logits, chosen, valid)
        else:
            h = self.mlp(self.mlp_norm(x))
        if self.mlp_post_norm is not None:
            h = self.mlp_post_norm(h)
        return x + h, sums


class Transformer(nnx.Module):
    """tokens [B, T] -> logits [B, T, V] (float32)."""

    def __init__(self, cfg: ModelConfig, *, dtype=jnp.float32, rngs: nnx.Rngs | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = cfg
        self.embedder = Embedder(cfg, dtype, rngs)
        self.layers = nnx.List([Block(cfg, t, dtype, rngs, cfg.routed(i))
                                for i, t in enumerate(cfg.layer_types)])
        self.final_norm = RMSNorm(cfg.hidden_size, cfg.norm_eps, cfg.norm_offset, dtype)
        # Gradient checkpointing of each block: "none", "full", "save_dots", "save_attention"
        # (full, but blockwise attention's output is kept, so its forward loops are not run
        # again; the other attention paths name nothing and run as full) or "offload" (dots
        # to host memory where the backend has one). Set by the trainer; static, so a change
        # compiles a new step.
        self.remat = "none"
        # Run whole groups of like blocks as a scan over their stacked weights
        # (hone.models.scan_layers): what makes remat bound the backward pass's memory on
        # XLA:CPU. Same numbers as the loop. Set by the trainer from train.scan_layers; static.
        self.scan_layers = False
        # Positions per chunk of the LM head when a loss scores a row (hone.models.head): rows
        # longer than this never form their whole [T, V] logits. 0 = the whole row at once.
        # Set by the trainer from train.head_chunk; static like remat.
        self.head_chunk = 0
        # How attention is computed: "auto", "dense", "blockwise", "cudnn" or "splash" (see
        # hone.models.attention.attention_path), over blocks of `attention_block` queries and
        # keys. Set by the trainer like remat; static, so a change compiles a new step.
        self.attention = "auto"
        self.attention_block = DEFAULT_BLOCK
        # An attention function over mask specs that replaces the choice above in the forward
        # pass, `f(q, k, v, spec, *, scale, softcap, block) -> [B, T, N, H]`: set by the layout
        # for sequence parallelism (hone/parallel/ring_attention.py), so this file names no mesh axis.
        # Static (hashable), like the settings above; the sampler's cached passes ignore it.
        self.sequence_attention: Callable | None = None
        # Mixture of experts: the router-loss coefficients of a training run (set by the
        # trainer from model.moe; static). When set, each forward pass records its routed
        # layers' router sums, which the train step takes (`pop_router_sums`) and adds to the
        # loss. None (and always for dense models): nothing is recorded.
        self.router_loss: RouterLoss | None = None
        self.lm_head = (None if cfg.tie_embeddings else
                        Linear((cfg.hidden_size,), (cfg.vocab_size,), ("embed", "vocab"), dtype,
                               rngs))

    # --- pieces shared by the full forward pass and the sampler -------------------------------
    def rope_for(self, positions: jax.Array) -> dict[str, tuple[jax.Array, jax.Array]]:
        """cos/sin tables per layer type: sliding layers may use their own rotary base."""
        cfg = self.config
        tables = {"global": rope_tables(positions, rope_inv_freq(
            cfg.head_dim, cfg.rope_theta, cfg.rope_scaling))}
        if "sliding" in cfg.layer_types:
            if cfg.rope_local_theta is None:
                tables["sliding"] = tables["global"]
            else:  # Gemma 3: local layers keep an unscaled base of their own
                tables["sliding"] = rope_tables(positions, rope_inv_freq(
                    cfg.head_dim, cfg.rope_local_theta, None))
        return tables

    def window_for(self, layer_type: str) -> int | None:
        return self.config.sliding_window if layer_type == "sliding" else None

    def logits_from_hidden(self, x: jax.Array) -> jax.Array:
        """Final-normed hidden states [B, T, D] -> float32 logits [B, T, V]."""
        if self.lm_head is None:
            logits = self.embedder.decode(x)
        else:
            logits = self.lm_head(x)
        logits = logits.astype(jnp.float32)
        cap = self.config.final_logit_softcap
        if cap is not None:
            logits = cap * jnp.tanh(logits / cap)
        return logits

    # --- full forward -------------------------------------------------------------------------
    def hidden(self, tokens: jax.Array, positions: jax.Array | None = None,
               attention_mask: jax.Array | None = None,
               segment_ids: jax.Array | None = None, *,
               branch_ids: jax.Array | None = None,
               embeds: jax.Array | None = None,
               bidirectional_ids: jax.Array | None = None) -> jax.Array:
        """Final-normed hidden states [B, T, D].

        attention_mask [B, T]: 1 for real tokens (padding may sit on either side). positions
        default to the count of real tokens before each one, which is right for left and right
        padding alike. segment_ids [B, T] (packing): tokens attend only within their segment.
        branch_ids [B, T] (a shared prefix scored once, `hone.data.shared_prefix`): 0 on the
        prefix, b >= 1 on the b-th continuation, which sees the prefix and itself only; needs
        explicit positions (each continuation's restart where the prefix ends), which then
        order causality and window distance instead of the slots. embeds [B, T, D]: the
        input embeddings to use instead of the tokens' (a vision-language model's, with image
        features at the image placeholders); tokens then only give the shape.
        bidirectional_ids [B, T] int (Gemma 3's image blocks): 0 on ordinary tokens, b >= 1 on
        the b-th block of the row, whose tokens also see the block's later tokens, on full and
        sliding layers alike (hone/models/masks.py); None: causal everywhere, as before. The
        dense and blockwise paths (and ring attention) honour it; cuDNN and splash cannot
        express it and fall back to blockwise.
        """
        return self.features(tokens, positions, attention_mask, segment_ids,
                             branch_ids=branch_ids, embeds=embeds,
                             bidirectional_ids=bidirectional_ids)[0]

    def features(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None,
                 *, hidden_layers: tuple[int, ...] = (), attention_layers: tuple[int, ...] = (),
                 branch_ids: jax.Array | None = None, embeds: jax.Array | None = None,
                 bidirectional_ids: jax.Array | None = None):
        """(final-normed hidden [B, T, D], {"hidden": {l: [B, T, D]}, "attention": {l: [B, N,
        T, T]}}) from one forward pass: the intermediate activations distillation matches.

        hidden_layers index the residual stream as transformers' `hidden_states` does: 0 is
        the embedding output, l >= 1 the output of block l (not final-normed). attention_layers
        are 0-based block indices; their maps are the float32 softmax probabilities over keys.
        The other arguments are `hidden`'s.
        """
        n = len(self.layers)
        if any(not 0 <= i <= n for i in hidden_layers) or any(
                not 0 <= i < n for i in attention_layers):
            raise ValueError(f"features: hidden_layers must lie in [0, {n}] and "
                             f"attention_layers in [0, {n - 1}]; got {tuple(hidden_layers)} "
                             f"and {tuple(attention_layers)}")
        b, t = tokens.shape
        valid = (jnp.ones((b, t), jnp.bool_) if attention_mask is None
                 else attention_mask.astype(jnp.bool_))
        if branch_ids is not None and positions is None:
            raise ValueError("features: branch_ids need explicit positions (each branch "
                             "continues from the end of the shared prefix)")
        if positions is None:
            positions = positions_from_mask(valid)
        index = (positions if branch_ids is not None else
                 jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32)[None, :], (b, t)))
        # Each layer gets the mask's vectors, not the [B, T, T] mask: the dense path builds it
        # inside the layer, the blockwise path one block pair at a time.
        masks = {kind: MaskSpec(index, index, valid, self.window_for(kind),
                                segment_ids, segment_ids, branch_ids, branch_ids,
                                bidirectional_ids, bidirectional_ids)
                 for kind in set(self.config.layer_types)}
        impl, block = self.sequence_attention or self.attention, self.attention_block
        ropes = self.rope_for(positions)
        x = self.embedder.encode(tokens) if embeds is None else embeds
        captured: dict = {"hidden": {}, "attention": {}}
        if 0 in hidden_layers:
            captured["hidden"][0] = x
        # [B*T]: the tokens whose routing the router losses count (None: record nothing)
        record = (valid.reshape(-1) if self.router_loss is not None
                  and self.config.moe is not None else None)

        def run(layer, x, cos, sin, mask):
            return layer.forward(
                x, lambda h: layer.attn(h, cos, sin, mask, impl=impl, block=block), record)

        def run_probs(layer, x, cos, sin, mask):
            probs = []

            def attend(h):
                out, p = layer.attn(h, cos, sin, mask, return_probs=True)
                probs.append(p)
                return out

            x, sums = layer.forward(x, attend, record)
            return x, sums, probs[0]

        # Weights stored stacked (hone.models.stacked) are scanned whenever the pass allows it.
        if ((self.scan_layers or given_to(self) is not None) and not hidden_layers
                and not attention_layers and scannable(self.layers)):
            def step(layer, x):
                cos, sin = ropes[layer.layer_type]
                return run(layer, x, cos, sin, masks[layer.layer_type])

            policy = None if self.remat == "none" else remat_policy(self.remat)
            x, reports = run_blocks(self.layers, x, step, policy, given_to(self))
            self._record(reports)
            return self.final_norm(x), captured
        if self.remat != "none":
            run = nnx.remat(run, policy=remat_policy(self.remat))
            run_probs = nnx.remat(run_probs, policy=remat_policy(self.remat))
        reports = []
        for i, layer in enumerate(self.layers):
            cos, sin = ropes[layer.layer_type]
            if i in attention_layers:
                x, sums, captured["attention"][i] = run_probs(layer, x, cos, sin,
                                                              masks[layer.layer_type])
            else:
                x, sums = run(layer, x, cos, sin, masks[layer.layer_type])
            reports.append(sums)
            if i + 1 in hidden_layers:
                captured["hidden"][i + 1] = x
        self._record(reports)
        return self.final_norm(x), captured

    def _record(self, reports: list) -> None:
        """Keep the routed layers' router sums of this pass, stacked [L_routed, ...], as an
        nnx intermediate (several passes of one step append; `pop_router_sums` adds them)."""
        sums = [r for r in reports if r is not None]
        if sums:
            stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *sums)
            before = self.router_sums.get_value() if hasattr(self, "router_sums") else ()
            self.router_sums = nnx.Intermediate(before + (stacked,))

    def __call__(self, tokens: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None,
                 segment_ids: jax.Array | None = None, *,
                 branch_ids: jax.Array | None = None) -> jax.Array:
        return self.logits_from_hidden(self.hidden(tokens, positions, attention_mask, segment_ids,
                                                   branch_ids=branch_ids))


def pop_router_sums(model: nnx.Module) -> list[tuple[RouterLoss, RouterSums]]:
    """(coefficients, router sums) of every transformer inside `model` that recorded its
    routing in forward passes since it was built or last popped; the sums of several passes
    added. Removes them from the model. Empty for dense models and when nothing recorded."""
    found = []
    for _, module in nnx.iter_modules(model):
        if isinstance(module, Transformer) and hasattr(module, "router_sums"):
            passes = module.router_sums.get_value()  # a tuple: one entry per forward pass
            del module.router_sums
            total = jax.tree.map(lambda *xs: sum(xs), *passes)
            found.append((module.router_loss, total))
    return found
