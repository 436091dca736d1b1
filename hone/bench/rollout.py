"""How `hone bench rollout` times a rollout: one engine, one workload, in one process.

Workloads (--workload), G = --generations samples of each of --batch prompts of --prompt-len
random tokens, each sample's length drawn beforehand and enforced by ending it there (a random
model has no end token to stop on):
- long-tail: lengths from a fixed, seeded distribution: a fifth run to the limit (--seq new
  tokens, 512 by default), the rest log-uniform between 16 and the limit, so most samples are
  short and a few are long, as RL completions are;
- uniform: every sample runs to the limit (--seq, 128 by default).
Engines (--engine):
- static: `hone.generate`'s lockstep sampler, all prompts x G rows at once over a cache of
  rows x (prompt + limit) slots; a row whose sample has ended decodes padding until the
  longest one ends, so its time is that of every row running to the limit;
- paged: the rollout engine (hone/sampling/scheduler.py) with --max-seqs slots over a page pool
  sized for them; an ended sample's slot is taken by the next at once, a prompt's G samples
  share its pages.
tokens_per_s counts the samples' tokens (the sum of the drawn lengths, the same for both
engines) over the wall time of the whole rollout, prefill included; kv_bytes is the KV cache the
engine allocated (static: its cache; paged: its page pool); peak_rss_mb the process's peak.
"""

from __future__ import annotations

import time
from typing import Callable

import numpy as np

from hone.bench import flops
from hone.bench.rows import Measured, quiet

WORKLOADS = ("long-tail", "uniform")
ENGINES = ("static", "paged")


def sample_lengths(workload: str, samples: int, limit: int, seed: int = 0) -> list[int]:
    """Each sample's number of new tokens (see the module docstring)."""
    if workload == "uniform":
        return [limit] * samples
    rng = np.random.default_rng(seed)
    to_limit = rng.random(samples) < 0.2
    short = np.exp(rng.uniform(np.log(16), np.log(limit), samples)).astype(int)
    return np.where(to_limit, limit, np.clip(short, 1, limit)).tolist()


def static_kv_bytes(model, rows: int, slots: int, dtype) -> int:
    """The static sampler's cache: keys and values of `rows` x `slots` in every layer (a
    sliding layer keeps its window)."""
    from hone.sampling.cache import cache_len
    cfg = model.config
    per_slot = 2 * cfg.num_kv_heads * cfg.head_dim * np.dtype(dtype).itemsize
    return int(sum(rows * cache_len(model, kind, slots) * per_slot for kind in cfg.layer_types))


def rollout_row(model: str, workload: str, engine: str, *, prompts: int = 32,
                generations: int = 8, prompt_len: int = 64, limit: int = 512,
                max_seqs: int = 64, repeats: int = 1, seed: int = 0,
                num_pages: int | None = None, precision: str = "fp32",
                log: Callable = quiet) -> Measured:
    """Time the rollout `repeats` times after a first (compiling) one. num_pages: the paged
    engine's pool (None: its default, room for max_seqs sequences of the longest length).
    precision: the weights' and caches' dtype, "fp32" or "bf16"."""
    import jax
    import jax.numpy as jnp

    from hone.sampling.buckets import bucket
    from hone.sampling.generate import generate
    from hone.sampling.scheduler import PagedEngine, Request
    from hone.weights.loading import load_model

    log(f"rollout: building {model}; {workload}, {engine} engine, {prompts} prompts x "
        f"{generations} of up to {limit} tokens")
    net = load_model(model, "bfloat16" if precision == "bf16" else "float32", seed=seed)
    cfg = net.config
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, cfg.vocab_size, size=(prompts, prompt_len)).tolist()
    lengths = sample_lengths(workload, prompts * generations, limit, seed)
    dtype = net.embedder.embedding[...].dtype
    if engine == "static":
        kv = static_kv_bytes(net, bucket(prompts * generations, minimum=1),
                             bucket(prompt_len) + bucket(limit), dtype)

        def once():
            return generate(net, None, ids, max_new_tokens=limit, temperature=1.0, n=generations,
                            eos_ids=(), seed=seed)
    else:
        max_seqs = min(max_seqs, prompts * generations)
        paged = PagedEngine(net, max_seqs=max_seqs, max_len=prompt_len + limit,
                            num_pages=num_pages)
        kv = paged.kv_bytes
        key = jax.random.key(seed)

        def once():
            requests = [Request(p, limit, jax.random.fold_in(key, i), n=generations,
                                sample_limits=tuple(lengths[i * generations:(i + 1) * generations]))
                        for i, p in enumerate(ids)]
            return paged.run(requests, temperature=1.0)
    times = []
    for i in range(1 + repeats):
        start = time.perf_counter()
        jax.block_until_ready(jnp.zeros(()))
        out = once()
        times.append(time.perf_counter() - start)
        log(f"rollout {i}: {times[-1]:.1f} s")
    made = (sum(len(s.tokens) for row in out for s in row) if engine == "paged"
            else sum(min(len(o.tokens), n) for o, n in zip(out, lengths)))
    tokens = sum(lengths)
    assert made == tokens, (made, tokens)  # every sample ran to its drawn length
    median = float(np.median(times[1:])) if repeats else times[0]
    extra = {"workload": workload, "engine": engine, "kv_bytes": kv, "generations": generations,
             "limit": limit, "prompt_len": prompt_len, "mean_length": float(np.mean(lengths))}
    if engine == "paged":
        extra.update(max_seqs=max_seqs, num_pages=paged.num_pages,
                     preempted=paged.stats["preempted"],
                     peak_pages=paged.stats["peak_pages"], page_size=paged.page_size)
    # The FLOPs of the work asked for: each sample's prompt and its own length (what a static
    # row decodes past its length is not counted).
    work = sum(flops.decode_flops(cfg, 1, prompt_len, n) for n in lengths)
    return Measured(first_s=times[0], median_s=median, tokens=tokens, flops=work, extra=extra)
