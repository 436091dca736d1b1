"""`hone.generate`: prompts in, completions with per-token log-probabilities out.

Inputs are checked before anything is compiled. Prompts are left-padded into buckets (batch to a
power of two, prompt length and new-token budget to powers of two from 16), so a program serving
varied requests compiles a handful of shapes and then only reuses them.

Completion tokens include the end-of-sequence token when one was generated (its log-probability
is part of the sequence's probability); `.text` leaves it out. Stop strings end a completion
too; the text stops before the stop string and the tokens at the first token that completes it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from hone.errors import InputError
from hone.sampling.buckets import bucket
from hone.sampling.engine import decode, embed_prompts, pack_weights, prefill
from hone.sampling.engine import split_for_sampling
from hone.sampling.strategies import SamplingMode


@dataclass
class Completion:
    text: str | None  # the completion only (None when prompts were token ids without tokenizer)
    tokens: list[int]  # completion token ids, the end-of-sequence token included if generated
    logprobs: list[float]  # log p(token) under the model (no temperature, no truncation)
    sampling_logprobs: list[float] = field(default_factory=list)  # under the sampled distribution
    finish_reason: str = "length"  # "eos", "stop" or "length"


def encode_prompt(tokenizer, text: str) -> list[int]:
    """Token ids of a prompt; no second BOS when a chat template already wrote one."""
    ids = tokenizer.encode(text)
    bos = getattr(tokenizer, "bos_id", None)
    if bos is not None and len(ids) >= 2 and ids[0] == ids[1] == bos:
        ids = ids[1:]
    return ids


def _check(prompts, tokenizer, max_new_tokens, temperature, top_k, top_p, context):
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
        raise InputError("prompts must be a non-empty list of strings or token-id lists",
                         key="prompts")
    if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
        raise InputError(f"must be a positive integer, got {max_new_tokens!r}",
                         key="max_new_tokens")
    if temperature is None or temperature < 0:
        raise InputError(f"must be >= 0 (0 = greedy), got {temperature!r}", key="temperature")
    if top_k is not None and (not isinstance(top_k, int) or top_k <= 0):
        raise InputError(f"must be a positive integer or None, got {top_k!r}", key="top_k")
    if top_p is not None and not 0.0 < top_p <= 1.0:
        raise InputError(f"must be in (0, 1] or None, got {top_p!r}", key="top_p")
    ids = []
    for i, p in enumerate(prompts):
        if isinstance(p, str):
            if tokenizer is None:
                raise InputError("a text prompt needs a tokenizer", key=f"prompts[{i}]")
            p = encode_prompt(tokenizer, p)
        p = [int(t) for t in p]
        if not p:
            raise InputError("prompt is empty", key=f"prompts[{i}]")
        if len(p) + max_new_tokens > context:
            raise InputError(f"prompt of {len(p)} tokens plus max_new_tokens {max_new_tokens} "
                             f"exceeds the model's context of {context}", key=f"prompts[{i}]")
        ids.append(p)
    return ids


def generate(model, tokenizer, prompts, max_new_tokens: int = 64, temperature: float = 0.0,
             top_k: int | None = None, top_p: float | None = None, seed: int = 0,
             stop: Sequence[str] = (), eos_ids: Sequence[int] | None = None,
             on_step: Callable[[np.ndarray], None] | None = None,
             cache_dtype=None, min_prompt_bucket: int = 16, n: int = 1,
             prefill_chunk: int | None = None, engine: str = "static",
             max_seqs: int | None = None, pixel_values=None,
             pixel_attention_mask=None) -> list[Completion]:
    """Complete each prompt (text, or a list of token ids) with up to max_new_tokens tokens.

    temperature 0 is greedy. n: completions per prompt, returned prompt by prompt (n for the
    first prompt, then n for the second, ...); the n share one prefill of their prompt and draw
    the samples a call listing each prompt n times draws (RL groups, pass@k). on_step, if
    given, is called with the tokens generated so far [rows, steps] after every step
    (streaming). cache_dtype defaults to the model's parameter dtype; jnp.bfloat16 halves the
    cache (the decode step reads it in float32; docs/guides/_sampler_long.md has the drift).
    prefill_chunk: run the prompt in pieces of this many positions, each against the cache
    written so far (activation memory O(chunk) instead of O(prompt); the same numbers).
    min_prompt_bucket: the smallest padded prompt length; a caller whose prompts have a known
    maximum (RL) passes it, so every call reuses one compiled shape.
    engine: "static" decodes the batch in lockstep over a preallocated cache; "paged" runs the
    rollout engine (hone/sampling/scheduler.py): at most max_seqs sequences at once over a
    paged cache, a finished one's slot taken by the next, the n samples of a prompt sharing its
    pages. Greedy output is the same; sampled tokens differ from the static engine's (each
    sequence draws from its own key: fold_in(fold_in(key(seed), prompt), sample), then token
    index) and do not depend on max_seqs or the schedule.
    pixel_values [len(prompts), I, C, Y, X] and pixel_attention_mask [len(prompts), I, Y, X]
    (numpy or jax, as transformers' processor returns them): prompt i's images, for a
    vision-language model (an Idefics3 from hone.load_model), all-zero slots where a prompt has
    fewer than I; prompt i's ids hold their expanded `<image>` placeholders. The prefill runs
    the model's image-filled embeddings (`model.embed`), decoding its language model
    (`model.text`) as for a text model. The static engine only, for now.
    """
    vlm = model
    model = _language_model(model)
    cfg = model.config
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise InputError(f"must be a positive integer, got {n!r}", key="n")
    if prefill_chunk is not None and (not isinstance(prefill_chunk, int)
                                      or isinstance(prefill_chunk, bool) or prefill_chunk < 1):
        raise InputError(f"must be a positive integer or None, got {prefill_chunk!r}",
                         key="prefill_chunk")
    ids = _check(prompts, tokenizer, max_new_tokens, temperature, top_k, top_p,
                 cfg.max_position_embeddings)
    if top_k is not None:
        top_k = min(top_k, cfg.vocab_size)
    if pixel_values is not None:
        _check_images(vlm, model, ids, pixel_values, pixel_attention_mask, engine)
    if eos_ids is None:
        eos_ids = tuple(getattr(tokenizer, "eos_ids", ()) or ())
    if engine == "paged":
        return _generate_paged(model, tokenizer, ids, max_new_tokens, temperature, top_k, top_p,
                               seed, stop, eos_ids, on_step, cache_dtype, n, prefill_chunk,
                               max_seqs, min_prompt_bucket)
    if engine != "static":
        raise InputError(f"unknown engine {engine!r}; allowed: static, paged", key="engine")
    pad_id = getattr(tokenizer, "pad_id", None) or 0
    b, p = len(ids), bucket(max(len(x) for x in ids), minimum=max(16, min_prompt_bucket))
    bb = bucket(b, minimum=1)
    new = bucket(max_new_tokens)
    tokens = np.full((bb, p), pad_id, np.int32)
    valid = np.zeros((bb, p), bool)
    for i, x in enumerate(ids):
        tokens[i, p - len(x):] = x
        valid[i, p - len(x):] = True
    mode = SamplingMode(greedy=temperature == 0.0, top_k=top_k, use_top_p=top_p is not None)
    embeds = None
    if pixel_values is not None:  # the image-filled prompt embeddings, batch padding included
        vlm.check_images(tokens[:b], pixel_values)
        embeds = embed_prompts(*split_for_sampling(vlm), tokens,
                               _pad_rows(pixel_values, bb), _pad_rows(pixel_attention_mask, bb))
    graphdef, params = split_for_sampling(model)
    temp = jnp.float32(temperature or 1.0)
    nucleus = jnp.float32(top_p if top_p is not None else 1.0)
    dtype = cache_dtype or model.embedder.embedding[...].dtype
    state = prefill(graphdef, params, tokens, valid, jax.random.key(seed), temp, nucleus,
                    mode=mode, total=p + new, cache_dtype=jnp.dtype(dtype), copies=n,
                    chunk=prefill_chunk, embeds=embeds)
    b *= n  # completions wanted; rows past them are batch padding
    eos = jnp.asarray(list(eos_ids) or [-1], jnp.int32)
    streaming = on_step is not None or bool(stop)
    packed = pack_weights(graphdef, params) if max_new_tokens > 1 else {}
    step = 1
    while True:
        limit = min(step + 1, max_new_tokens) if streaming else max_new_tokens
        state = decode(graphdef, params, packed, state, jnp.int32(limit), eos,
                       jnp.int32(pad_id), temp, nucleus, mode=mode)
        step = int(state["step"])
        done = np.asarray(state["done"])
        if streaming:
            so_far = np.asarray(state["tokens"][:b, :step])
            if on_step is not None:
                on_step(so_far)
            if stop:
                hit = [_stop_cut(tokenizer, row, stop) is not None for row in so_far]
                if any(hit):
                    state["done"] = state["done"].at[:b].set(done[:b] | np.array(hit))
                    done = np.asarray(state["done"])
        if step >= max_new_tokens or done[:b].all():
            break
    return _completions(state, b, tokenizer, eos_ids, stop)


def _language_model(model):
    """The model that decodes: a vision-language model's language model (`text`; its images
    enter once, through `embed`, at prefill), else the model itself."""
    if hasattr(model, "text") and hasattr(model, "embed"):
        return model.text
    return model


def _check_images(vlm, text, ids, pixel_values, pixel_attention_mask, engine) -> None:
    """Image inputs fit the model, the prompts and the engine (before anything compiles)."""
    from hone.models.vision.idefics3 import Idefics3
    if vlm is text:
        raise InputError("pixel_values need a vision-language model (this one reads text only)",
                         key="pixel_values")
    if not isinstance(vlm, Idefics3):  # Gemma 3's image blocks attend both ways in prefill
        raise InputError(f"generation with images supports Idefics3 / SmolVLM so far, not "
                         f"{type(vlm).__name__}", key="pixel_values")
    if engine == "paged":
        raise InputError("the paged engine does not take images yet; use engine='static'",
                         key="engine")
    shape = np.shape(pixel_values)
    if len(shape) != 5 or shape[0] != len(ids):
        raise InputError(f"expected [prompts={len(ids)}, images, channels, height, width], got "
                         f"shape {shape}", key="pixel_values")
    if pixel_attention_mask is not None and np.shape(pixel_attention_mask) != (
            shape[:2] + shape[3:]):
        raise InputError(f"expected shape {shape[:2] + shape[3:]} (pixel_values' without the "
                         f"channels), got {np.shape(pixel_attention_mask)}",
                         key="pixel_attention_mask")


def _pad_rows(x, rows: int):
    """x [B, ...] with all-zero rows appended up to `rows` (the batch bucket's padding rows:
    no images); None stays None."""
    if x is None:
        return None
    x = np.asarray(x)
    return np.concatenate([x, np.zeros((rows - x.shape[0],) + x.shape[1:], x.dtype)])


def _generate_paged(model, tokenizer, ids, max_new_tokens, temperature, top_k, top_p, seed,
                    stop, eos_ids, on_step, cache_dtype, n, prefill_chunk, max_seqs,
                    min_prompt_bucket):
    from hone.sampling.scheduler import PagedEngine, Request
    if on_step is not None:
        raise InputError("streaming (on_step) is not available with engine='paged' yet",
                         key="on_step")
    if max_seqs is not None and (not isinstance(max_seqs, int) or isinstance(max_seqs, bool)
                                 or max_seqs < 1):
        raise InputError(f"must be a positive integer or None, got {max_seqs!r}",
                         key="max_seqs")
    key = jax.random.key(seed)
    requests = [Request(p, max_new_tokens, jax.random.fold_in(key, i), n=n)
                for i, p in enumerate(ids)]
    # The prompts' room as the static sampler pads it (a power of two, at least
    # min_prompt_bucket): calls with other prompt lengths keep the engine's shapes (its page
    # tables' width, its pool), so they compile nothing new.
    room = bucket(max(len(p) for p in ids), minimum=max(16, min_prompt_bucket))
    max_len = min(room + max_new_tokens, model.config.max_position_embeddings)
    engine = PagedEngine(model, max_seqs=max_seqs or min(len(ids) * n, 64), max_len=max_len,
                         cache_dtype=cache_dtype, prefill_chunk=prefill_chunk or 1024)
    samples = engine.run(requests, temperature=temperature, top_k=top_k, top_p=top_p,
                         eos_ids=eos_ids)
    return [_completion(s.tokens, s.logprobs, s.sampling_logprobs, tokenizer, eos_ids, stop)
            for row in samples for s in row]


def _stop_cut(tokenizer, row: np.ndarray, stop: Sequence[str]) -> tuple[int, int] | None:
    """(tokens to keep, characters to keep) if a stop string occurs in the decoded row."""
    text = tokenizer.decode([int(t) for t in row])
    found = [(text.find(s), s) for s in stop if s and s in text]
    if not found:
        return None
    chars = min(found)[0]
    for k in range(1, len(row) + 1):  # the first token whose text completes the stop string
        if any(s in tokenizer.decode([int(t) for t in row[:k]]) for s in stop if s):
            return k, chars
    return len(row), chars


def _completions(state, b, tokenizer, eos_ids, stop) -> list[Completion]:
    step = int(state["step"])
    toks = np.asarray(state["tokens"][:b, :step])
    lps = np.asarray(state["logprobs"][:b, :step])
    slps = np.asarray(state["sampling_logprobs"][:b, :step])
    return [_completion(toks[i].tolist(), lps[i].tolist(), slps[i].tolist(), tokenizer, eos_ids,
                        stop) for i in range(b)]


def _completion(row: list[int], lps: list[float], slps: list[float], tokenizer, eos_ids,
                stop) -> Completion:
    """A completion from a row of generated tokens: up to the first end token (kept), or
    to the token that completes a stop string."""
    eos = set(int(e) for e in eos_ids)
    row = [int(t) for t in row]
    n, reason = len(row), "length"
    for j, t in enumerate(row):
        if t in eos:
            n, reason = j + 1, "eos"
            break
    text_ids = row[:n - 1] if reason == "eos" else row[:n]
    text = None
    if tokenizer is not None:
        text = tokenizer.decode(text_ids, skip_special_tokens=True)
        cut = _stop_cut(tokenizer, np.asarray(text_ids, np.int32), stop) if stop else None
        if cut is not None:
            n, reason = cut[0], "stop"
            text = tokenizer.decode(text_ids, skip_special_tokens=False)[:cut[1]]
    return Completion(text=text, tokens=row[:n], logprobs=list(lps[:n]),
                      sampling_logprobs=list(slps[:n]), finish_reason=reason)
