"""The preallocated KV cache and the cached forward pass (prefill, extend, one decode step).

Layout: every row of the batch advances in lockstep over cache slots 0..S-1 (prompts are
left-padded to a common length, so slot index = step of the sequence). Global layers keep all
S slots; sliding-window layers keep only W = min(S, window) slots as a ring buffer, which is all
a window can ever see. Either way the slots written so far are a prefix of the cache, and a
decode step reads only that prefix (`Attention.attend_step`, in blocks). Keys and values are
stored kv-head-major, [B, K, S, H] per layer, so each head's keys are contiguous. Per layer
kind, `index` [S_kind] says which sequence slot each cache slot holds (-1: empty) and `valid`
[B, S_kind] says whether that key is a real token of the row (left padding is not). Masks are
built from these with the same `make_mask` the training forward uses, so the cached and the full
forward pass attend to exactly the same keys.

Extend (tokens appended to a cache that already holds a sequence: a prompt prefilled in chunks,
or the next turn of a multi-turn episode) is the prefill with the cache's keys in view; its
queries see the earlier slots through the same index and validity vectors.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from hone.models.attention import make_mask
from hone.models.masks import MaskSpec
from hone.models.transformer import Transformer

Cache = dict[str, Any]  # {"k": [L x [B,K,S_l,H]], "v": [...], "index": {kind: [S]}, "valid": {...}}


def cache_len(model: Transformer, kind: str, total: int) -> int:
    window = model.window_for(kind)
    return total if window is None else min(total, window)


def init_cache(model: Transformer, batch: int, total: int, dtype) -> Cache:
    """An empty cache for `batch` rows and `total` sequence slots (prompt + new tokens)."""
    cfg = model.config
    shape = lambda kind: (batch, cfg.num_kv_heads, cache_len(model, kind, total), cfg.head_dim)  # noqa: E731
    kinds = sorted(set(cfg.layer_types))
    return {
        "k": [jnp.zeros(shape(t), dtype) for t in cfg.layer_types],
        "v": [jnp.zeros(shape(t), dtype) for t in cfg.layer_types],
        "index": {t: jnp.full((cache_len(model, t, total),), -1, jnp.int32) for t in kinds},
        "valid": {t: jnp.zeros((batch, cache_len(model, t, total)), jnp.bool_) for t in kinds},
    }


def rope_table(model: Transformer, total: int) -> dict:
    """cos/sin [1, total, H] per layer kind for positions 0..total-1 (a row's positions never
    reach its slot count)."""
    return model.rope_for(jnp.arange(total, dtype=jnp.int32)[None])


def _write(buf: jax.Array, new: jax.Array, start: jax.Array, axis: int = 1) -> jax.Array:
    """Write `new` into ring buffer `buf` along the sequence axis at sequence slots
    start..start+T-1 (T = new.shape[axis]; the axes before it are batch-like).

    When T > S only the last S entries survive, exactly as if written one by one.
    """
    s, t = buf.shape[axis], new.shape[axis]
    if t == 1:  # a decode step: one slot, written in place (a scatter is slower on CPU)
        return jax.lax.dynamic_update_slice_in_dim(buf, new, start % s, axis=axis)
    if t > s:
        new = jax.lax.slice_in_dim(new, t - s, t, axis=axis)
        start, t = start + (t - s), s
    slots = (start + jnp.arange(t)) % s
    return buf.at[(slice(None),) * axis + (slots,)].set(new)


def _store(buf: jax.Array, new: jax.Array, start: jax.Array) -> jax.Array:
    """Write keys or values new [B, T, K, H] into one layer's kv-head-major cache [B, K, S, H]."""
    return _write(buf, new.transpose(0, 2, 1, 3).astype(buf.dtype), start, axis=2)


def _as_keys(buf: jax.Array, dtype) -> jax.Array:
    """One layer's kv-head-major cache [B, K, S, H] as attention keys or values [B, S, K, H]."""
    return buf.transpose(0, 2, 1, 3).astype(dtype)


def forward_cached(model: Transformer, cache: Cache, tokens: jax.Array, positions: jax.Array,
                   valid: jax.Array, start: jax.Array, *, rope: dict, kernels: bool = False,
                   cached_keys: bool = False,
                   embeds: jax.Array | None = None) -> tuple[jax.Array, Cache]:
    """Run `tokens` [B, T] occupying sequence slots start..start+T-1; return logits of the last
    slot [B, V] and the updated cache. embeds [B, T, D]: the input embeddings to run instead
    of the tokens' (a vision-language prompt's, image features at its placeholders).

    Three cases, chosen statically:
    - prefill (T > 1, cached_keys False: the cache is empty) attends over its own fresh keys,
      so a prompt longer than a sliding window is exact even though the ring keeps only the
      last W keys;
    - extend (T > 1, cached_keys True: slots before `start` hold keys) attends over those and
      its own keys. Global layers write first and read the whole cache; sliding-window layers
      read the ring as it was *before* the write beside the chunk's fresh keys, then write:
      a chunk of more than one token overwrites ring slots its own first queries still see;
    - decode (T = 1) attends over the cache after writing its own key; with `kernels` (the
      CPU, where the sampler packed the weights) in hone's attention kernel.
    Prefill and extend hand `Attention.attend` a MaskSpec, so `model.attention` chooses the path
    as in training: dense while queries and keys fit one block (a short prompt runs exactly
    the program it always did), blockwise beyond, never a [B, T, S] mask then.
    rope: `rope_table`'s cos/sin for every position, looked up instead of computed (XLA fuses
    cos and sin into each layer's rotation and computes them again per head and layer: 170 us
    a layer of a CPU decode step at batch 32).
    """
    b, t = tokens.shape
    q_index = jnp.broadcast_to(start + jnp.arange(t, dtype=jnp.int32), (b, t))
    step = t == 1
    new_cache: Cache = {"k": [], "v": [], "index": {}, "valid": {}}
    for kind in cache["index"]:
        new_cache["index"][kind] = _write(
            cache["index"][kind][None], q_index[:1], start)[0]
        new_cache["valid"][kind] = _write(cache["valid"][kind], valid, start)

    def slots_of(c, kind):  # [B, S_kind] index and validity of a cache's slots
        k_index = jnp.broadcast_to(c["index"][kind][None], (b,) + c["index"][kind].shape)
        return k_index, c["valid"][kind] & (k_index >= 0)

    specs, used = {}, {}
    for kind in cache["index"]:
        window = model.window_for(kind)
        if step:
            k_index, k_valid = slots_of(new_cache, kind)
            specs[kind] = make_mask(q_index, k_index, k_valid, window)
            # The slots holding keys are a prefix of the cache (the ring buffers' too).
            used[kind] = jnp.minimum(start + 1, new_cache["index"][kind].shape[0])
        elif not cached_keys:
            specs[kind] = MaskSpec(q_index, q_index, valid, window)
        elif window is None:  # global: the cache after the write
            specs[kind] = MaskSpec(q_index, *slots_of(new_cache, kind), window)
        else:  # sliding: the ring before the write, then the chunk
            k_index, k_valid = slots_of(cache, kind)
            specs[kind] = MaskSpec(q_index, jnp.concatenate([k_index, q_index], axis=1),
                                   jnp.concatenate([k_valid, valid], axis=1), window)
    ropes = {kind: (jnp.take(cos[0], positions, axis=0), jnp.take(sin[0], positions, axis=0))
             for kind, (cos, sin) in rope.items()}
    impl, block = model.attention, model.attention_block
    x = model.embedder.encode(tokens) if embeds is None else embeds
    for i, layer in enumerate(model.layers):
        kind = layer.layer_type
        cos, sin = ropes[kind]

        def attend(h, i=i, kind=kind, cos=cos, sin=sin, layer=layer):
            q, k, v = layer.attn.project_qkv(h, cos, sin)
            k_cache = _store(cache["k"][i], k, start)
            v_cache = _store(cache["v"][i], v, start)
            new_cache["k"].append(k_cache)
            new_cache["v"].append(v_cache)
            if step:
                return layer.attn.attend_step(q, k_cache, v_cache, specs[kind], used[kind],
                                              kernel=kernels)
            if cached_keys and model.window_for(kind) is None:
                k, v = _as_keys(k_cache, k.dtype), _as_keys(v_cache, v.dtype)
            elif cached_keys:
                k = jnp.concatenate([_as_keys(cache["k"][i], k.dtype), k], axis=1)
                v = jnp.concatenate([_as_keys(cache["v"][i], v.dtype), v], axis=1)
            return layer.attn.attend(q, k, v, specs[kind], impl=impl, block=block)

        x = layer(x, attend)
    last = model.final_norm(x[:, -1:])
    return model.logits_from_hidden(last)[:, 0], new_cache


def forward_chunks(model: Transformer, cache: Cache, tokens: jax.Array, positions: jax.Array,
                   valid: jax.Array, start: jax.Array, *, rope: dict, chunk: int | None,
                   cached_keys: bool, embeds: jax.Array | None = None) -> tuple[jax.Array, Cache]:
    """`forward_cached` over tokens [B, T] in pieces of `chunk` positions (None: one piece):
    the first piece takes T mod chunk positions (or a whole chunk), each later one extends
    the cache, so activations are O(chunk) whatever T. A loop over equal pieces: one
    compiled body however long the prompt. Returns the last slot's logits [B, V] and the
    cache. embeds [B, T, D]: as forward_cached's, cut into the same pieces."""
    t = tokens.shape[1]
    if chunk is None or chunk >= t:
        return forward_cached(model, cache, tokens, positions, valid, start, rope=rope,
                              cached_keys=cached_keys, embeds=embeds)
    head = t % chunk or chunk
    logits, cache = forward_cached(model, cache, tokens[:, :head], positions[:, :head],
                                   valid[:, :head], start, rope=rope, cached_keys=cached_keys,
                                   embeds=None if embeds is None else embeds[:, :head])

    def body(i, carry):
        at = head + i * chunk
        piece = lambda x: jax.lax.dynamic_slice_in_dim(x, at, chunk, axis=1)  # noqa: E731
        return forward_cached(model, carry[1], piece(tokens), piece(positions), piece(valid),
                              start + at, rope=rope, cached_keys=True,
                              embeds=None if embeds is None else piece(embeds))

    return jax.lax.fori_loop(0, (t - head) // chunk, body, (logits, cache))
