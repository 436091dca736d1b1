"""The jitted generation engine: one prefill and one decode loop per (batch, prompt length,
new-token) bucket, weights passed as arguments.

Design choices:
- The model's graph definition is a static argument and its parameters an ordinary one, so new
  weights (RL updates the policy every step) reuse the compiled code: no recompilation, and no
  second copy of the weights.
- The decode loop is a `lax.while_loop` that stops at a traced step limit or when every row has
  finished. Streaming calls the same compiled loop with a limit one step further each time.
- Each step's random key is `fold_in(seed_key, step)`, so the samples do not depend on how the
  loop is cut into calls (streaming or not).
- The cache and loop state are donated: the cache is updated in place.
- On the CPU, `pack_weights` lays every weight matrix out in column panels (one copy of the
  weights, or of their dequantized values for a quantized model) and the decode step multiplies
  by them with hone's kernel (hone/kernels/packed_matmul.cc), which streams a panel as one
  sequential read; XLA:CPU's products of a few rows by a row-major
  matrix are 1.3-3x slower at the SmolLM2 shapes. Each attention's q, k and v are packed side
  by side (one product), and each gated MLP's gate and up in pairs of panels (one call that
  also applies the activation; not when LoRA sits on gate or up). The step's attention runs in
  hone's kernel too (hone/kernels/decode_attention.cc). Prefill keeps XLA's products (many
  rows: the kernel was no faster there).
  Elsewhere (GPU, TPU, a mesh of several devices, no C++ compiler) the packed tree is empty and
  the step is the same program as before. The panels of the last weights packed are kept while
  those weights live (weak references: the entry goes when any of them is collected), so
  generating again with the same model packs nothing; packing costs about as much as 10 decode
  steps of SmolLM2-135M at batch 8, mostly the first touch of the new memory.
- `copies` samples per prompt (RL's groups, pass@k) share one prefill: the prompts are run once
  and their cache rows and last logits repeated, row i·copies + j holding copy j of prompt i.
  The first token is drawn from the repeated logits with the same key over the whole batch, so
  the samples are those of a batch that lists every prompt `copies` times.
"""

from __future__ import annotations

import collections
import weakref
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from hone.kernels import packed as packed_kernel
from hone.models.attention import Attention
from hone.models.layers import Embedder, positions_from_mask
from hone.models.linear import Linear
from hone.models.mlp import GatedMLP
from hone.sampling.cache import forward_cached, forward_chunks, init_cache, rope_table
from hone.sampling.strategies import SamplingMode, choose

# How many times each jitted function was traced (= compiled); tests read it.
TRACES: collections.Counter = collections.Counter()

State = dict[str, Any]


def _repeat_rows(cache, logits, positions, valid, copies: int):
    """Each prompt's cache rows, logits, positions and validity repeated `copies` times."""
    rep = lambda x: jnp.repeat(x, copies, axis=0)  # noqa: E731
    cache = {"k": [rep(k) for k in cache["k"]], "v": [rep(v) for v in cache["v"]],
             "index": cache["index"], "valid": {t: rep(v) for t, v in cache["valid"].items()}}
    return cache, rep(logits), rep(positions), rep(valid)


def _turn_state(cache, rope, logits, positions, valid, key, start, n: int, mode, temperature,
                top_p) -> State:
    """The decode state after tokens up to slot start-1 are in the cache: the first new token
    drawn from `logits` [B, V]; positions/valid [B, T] of the tokens just run."""
    b = logits.shape[0]
    token, lp, slp = choose(logits, jax.random.fold_in(key, 0), mode, temperature, top_p)
    return {
        "cache": cache,
        "rope": rope,  # cos/sin by position, for the decode steps
        "key": key,
        "step": jnp.int32(1),  # tokens generated so far
        "start": jnp.asarray(start, jnp.int32),  # sequence slot of the first generated token
        "next_pos": positions[:, -1] + 1,  # [B] position of the token just generated
        "done": ~valid[:, -1],  # rows that are batch padding never generate
        # [B] rows whose pending token is not part of the sequence (padding after the end
        # token, already written, or batch padding): decode writes it as invalid
        # and do not advance next_pos, so a finished row's cache holds its sequence only.
        "ended": ~valid[:, -1],
        "tokens": jnp.zeros((b, n), jnp.int32).at[:, 0].set(token),
        "logprobs": jnp.zeros((b, n), jnp.float32).at[:, 0].set(lp),
        "sampling_logprobs": jnp.zeros((b, n), jnp.float32).at[:, 0].set(slp),
    }


@partial(jax.jit, static_argnames=("graphdef", "mode", "total", "cache_dtype", "copies",
                                   "chunk"))
def prefill(graphdef, params, tokens, valid, key, temperature, top_p, *, mode: SamplingMode,
            total: int, cache_dtype, copies: int = 1, chunk: int | None = None,
            embeds=None) -> State:
    """Prompts tokens/valid [B, P] (left-padded) -> decode state of B·copies rows with the first
    new token. chunk: run the prompt in pieces of this many positions (`forward_chunks`).
    embeds [B, P, D]: the prompts' input embeddings in place of the tokens' (images filled in
    by a vision-language model's `embed`); decoding embeds its tokens as usual."""
    TRACES["prefill"] += 1
    model = nnx.merge(graphdef, params)
    b, p = tokens.shape
    positions = positions_from_mask(valid)
    cache = init_cache(model, b, total, cache_dtype)
    rope = rope_table(model, total)
    logits, cache = forward_chunks(model, cache, tokens, positions, valid, jnp.int32(0),
                                   rope=rope, chunk=chunk, cached_keys=False, embeds=embeds)
    if copies > 1:
        cache, logits, positions, valid = _repeat_rows(cache, logits, positions, valid, copies)
    return _turn_state(cache, rope, logits, positions, valid, key, p, total - p, mode,
                       temperature, top_p)


@partial(jax.jit, static_argnames=("graphdef",))
def embed_prompts(graphdef, params, tokens, pixel_values, pixel_attention_mask) -> jax.Array:
    """A vision-language model's prompt embeddings [B, P, D] (`embed`: its image features at the
    placeholders of tokens [B, P]), for `prefill`'s embeds. Its placeholder check cannot run
    under jit: the caller runs `check_images` first."""
    TRACES["embed_prompts"] += 1
    return nnx.merge(graphdef, params).embed(tokens, pixel_values, pixel_attention_mask)


def _parts(module) -> tuple:
    """The Linears a fused product stands for."""
    if isinstance(module, Attention):
        return module.q, module.k, module.v
    return module.gate, module.up


def _packable(model):
    """(path key, module) of every product the decode kernel can take over: each attention's
    q, k and v as one (the module is the Attention), each gated MLP's gate and up as one (the
    GatedMLP; not with LoRA on either, whose update comes before the activation), the other
    Linears, and the embedding table when it is also the output projection. A routed MLP
    (hone/models/moe.py) is none of these: its router and stacked experts stay unpacked and
    decode runs them through its grouped path; its shared expert (a GatedMLP) and that
    expert's gate (a Linear) are packed like any other."""
    tied = getattr(model, "lm_head", None) is None
    modules = list(nnx.iter_modules(model))
    fused = {id(m) for _, m in modules if isinstance(m, Attention) or (
        isinstance(m, GatedMLP) and m.gate.lora is None and m.up.lora is None)}
    inside = {id(lin) for _, m in modules if id(m) in fused for lin in _parts(m)}
    for path, module in modules:
        if (id(module) in fused or (isinstance(module, Linear) and id(module) not in inside)
                or (isinstance(module, Embedder) and tied)):
            yield "/".join(map(str, path)), module


def _panels(module) -> jax.Array:
    """The column panels of what a packable module multiplies by (a GatedMLP: its pairs)."""
    if isinstance(module, GatedMLP):
        return packed_kernel.pack_pair(module.gate.weight(), module.up.weight())
    if isinstance(module, Attention):  # [Wq | Wk | Wv]
        return packed_kernel.pack(jnp.concatenate([p.weight() for p in _parts(module)], axis=1))
    if isinstance(module, Embedder):
        return packed_kernel.pack(module.embedding[...].T)
    return packed_kernel.pack(module.weight())


@partial(jax.jit, static_argnames=("graphdef",))
def _pack(graphdef, params) -> dict[str, jax.Array]:
    TRACES["pack"] += 1
    model = nnx.merge(graphdef, params)
    return {key: _panels(module) for key, module in _packable(model)}


# The last packed weights: (graphdef, weak references to the params' leaves, panels).
_LAST: list = []


def _forget(ref) -> None:
    if _LAST and any(r is ref for r in _LAST[0][1]):
        _LAST.clear()


def _packed_for(graphdef, leaves) -> dict[str, jax.Array] | None:
    """The kept panels if they were packed from exactly these arrays, else None."""
    if not _LAST:
        return None
    old_graphdef, refs, panels = _LAST[0]
    same = (old_graphdef == graphdef and len(refs) == len(leaves)
            and all(ref() is leaf for ref, leaf in zip(refs, leaves)))
    return panels if same else None


def pack_weights(graphdef, params) -> dict[str, jax.Array]:
    """The model's weights in column panels for the decode kernel, by module path; empty where
    the kernel cannot run (not the CPU, weights on several devices, no compiler). Reuses the
    last result while these very arrays are passed again."""
    if not packed_kernel.usable(params):
        return {}
    leaves = jax.tree.leaves(params)
    kept = _packed_for(graphdef, leaves)
    if kept is not None:
        return kept
    _LAST.clear()  # before packing: never two sets of panels alive at once
    panels = _pack(graphdef, params)
    try:
        refs = [weakref.ref(leaf, _forget) for leaf in leaves]
    except TypeError:  # a leaf that is not an array: nothing to key the entry on
        return panels
    _LAST.append((graphdef, refs, panels))
    return panels


def attach_packed(model, packed: dict[str, jax.Array]) -> None:
    """Hand each packable module its panels (none: the model runs XLA's products)."""
    if not packed:
        return
    for key, module in _packable(model):
        if isinstance(module, GatedMLP):
            module.packed_gate_up = packed[key]
        elif isinstance(module, Attention):
            module.packed_qkv = packed[key]
        else:
            module.packed = packed[key]


def _finish(state: State, token, eos_ids) -> jax.Array:
    return state["done"] | jnp.isin(token, eos_ids)


@partial(jax.jit, static_argnames=("graphdef", "mode"), donate_argnames=("state",))
def decode(graphdef, params, packed, state: State, limit, eos_ids, pad_id, temperature, top_p,
           *, mode: SamplingMode) -> State:
    """Generate until `limit` tokens exist per row or every row has finished. packed: the
    result of `pack_weights` for these params (may be empty)."""
    TRACES["decode"] += 1
    model = nnx.merge(graphdef, params)
    attach_packed(model, packed)
    b = state["tokens"].shape[0]
    # A row is done once its last generated token is an end-of-sequence token.
    first = state["tokens"][jnp.arange(b), state["step"] - 1]
    state = dict(state, done=_finish(state, first, eos_ids))

    def cond(s):
        return (s["step"] < limit) & ~jnp.all(s["done"])

    def body(s):
        step = s["step"]
        last = s["tokens"][:, step - 1]
        write = ~s["ended"]  # [B] is `last` part of the row's sequence?
        logits, cache = forward_cached(
            model, s["cache"], last[:, None], s["next_pos"][:, None], write[:, None],
            s["start"] + step - 1, kernels=bool(packed), rope=s["rope"])
        token, lp, slp = choose(logits, jax.random.fold_in(s["key"], step), mode, temperature,
                                top_p)
        token = jnp.where(s["done"], pad_id, token)
        zero = jnp.zeros_like(lp)
        return dict(
            s, cache=cache, step=step + 1, next_pos=s["next_pos"] + write, ended=s["done"],
            done=_finish(s, token, eos_ids),
            tokens=s["tokens"].at[:, step].set(token),
            logprobs=s["logprobs"].at[:, step].set(jnp.where(s["done"], zero, lp)),
            sampling_logprobs=s["sampling_logprobs"].at[:, step].set(
                jnp.where(s["done"], zero, slp)))

    return jax.lax.while_loop(cond, body, state)


def split_for_sampling(model) -> tuple[Any, Any]:
    """(graphdef, state): the model's whole state (parameters, LoRA adapters, quantized weights
    and every other variable), the arrays `prefill`/`decode` take as jit arguments each call so
    new weights need no recompile. Not `hone.train.state.split_model`, which splits off the
    trainable part."""
    graphdef, state = nnx.split(model)
    return graphdef, state
