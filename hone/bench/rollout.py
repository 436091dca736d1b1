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
Paged rows add what the decode windows did over the timed rollouts: `window` and `overlap` (the
engine's settings), `windows`, `decode_steps`, `host_waits` (blocking reads of the device),
`wasted_row_steps` (row-steps of stopped rows and padding) of `row_steps`, `engine_programs`
and `later_engine_programs` (the engine's own programs traced in the first rollout and in the
timed ones); and, for the first rollout and for the timed ones, `programs` (JAX programs
traced, jax.monitoring's trace events: the engine's and every other, the weights' packing say)
and `compile_s` (XLA's compile time; a program taken from a persistent compilation cache
counts as traced, not compiled); with --warmup, `warmup_s`, `warmup_programs` and
`warmup_compile_s` of `PagedEngine.warmup` before the first rollout. --prompt-lens LO-HI draws
each prompt's length in that range, anew for each rollout (so a later rollout has other
lengths than the first).

With --tunix (`tunix_row`), the same workload on Tunix's vanilla sampler instead:
benchmarks/rollout_tunix.py run by the Tunix venv's python (benchmarks/_venvs.py makes it on
first use), so only from a source checkout; like the static sampler it decodes every row to the
limit, and its tokens_per_s counts the same drawn lengths.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
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


class CompileCounter:
    """Counts JAX's program traces and sums XLA's compile seconds while it is entered
    (jax.monitoring listeners; every jitted program of the process, the engine's and any
    other)."""

    TRACE = "/jax/core/compile/jaxpr_trace_duration"
    COMPILE = "/jax/core/compile/backend_compile_duration"

    def __init__(self):
        self.programs, self.compile_s, self.on = 0, 0.0, False
        import jax.monitoring
        jax.monitoring.register_event_duration_secs_listener(self._event)

    def _event(self, event: str, duration: float, **_) -> None:
        if self.on and event == self.TRACE:
            self.programs += 1
        elif self.on and event == self.COMPILE:
            self.compile_s += duration

    def __enter__(self):
        self.programs, self.compile_s, self.on = 0, 0.0, True
        return self

    def __exit__(self, *exc):
        self.on = False


_COUNTER: list = []  # one listener a process: jax.monitoring cannot drop a single one


def compile_counter() -> CompileCounter:
    if not _COUNTER:
        _COUNTER.append(CompileCounter())
    return _COUNTER[0]


def rollout_row(model: str, workload: str, engine: str, *, prompts: int = 32,
                generations: int = 8, prompt_len: int = 64, limit: int = 512,
                max_seqs: int = 64, repeats: int = 1, seed: int = 0,
                num_pages: int | None = None, precision: str = "fp32",
                window: int | None = None, overlap: bool | None = None,
                prompt_lens: tuple[int, int] | None = None, warmup: bool = False,
                attention: str | None = None, log: Callable = quiet) -> Measured:
    """Time the rollout `repeats` times after a first (compiling) one. num_pages: the paged
    engine's pool (None: its default, room for max_seqs sequences of the longest length).
    precision: the weights' and caches' dtype, "fp32" or "bf16". window, overlap: the paged
    engine's decode window and whether it overlaps the host (None: its defaults here).
    prompt_lens: (lo, hi): each prompt's length drawn in that range, anew for each rollout
    (None: prompt_len for all). warmup: the paged engine compiles its programs first.
    attention: the paged engine's route over pages ("xla": XLA's loop; None: its default)."""
    import jax
    import jax.numpy as jnp

    from hone.sampling.buckets import bucket
    from hone.sampling.generate import generate
    from hone.sampling.paged import TRACES
    from hone.sampling.scheduler import PagedEngine, Request
    from hone.weights.loading import load_model

    log(f"rollout: building {model}; {workload}, {engine} engine, {prompts} prompts x "
        f"{generations} of up to {limit} tokens")
    net = load_model(model, "bfloat16" if precision == "bf16" else "float32", seed=seed)
    cfg = net.config
    rng = np.random.default_rng(seed)
    lo, hi = prompt_lens or (prompt_len, prompt_len)
    prompt_sets = [[rng.integers(3, cfg.vocab_size, int(rng.integers(lo, hi + 1))).tolist()
                    for _ in range(prompts)] for _ in range(1 + repeats)]
    at = iter(prompt_sets)
    lengths = sample_lengths(workload, prompts * generations, limit, seed)
    dtype = net.embedder.embedding[...].dtype
    if engine == "static":
        kv = static_kv_bytes(net, bucket(prompts * generations, minimum=1),
                             bucket(hi) + bucket(limit), dtype)

        def once():
            return generate(net, None, next(at), max_new_tokens=limit, temperature=1.0,
                            n=generations, eos_ids=(), seed=seed)
    else:
        max_seqs = min(max_seqs, prompts * generations)
        paged = PagedEngine(net, max_seqs=max_seqs, max_len=hi + limit,
                            num_pages=num_pages, sync_steps=window, overlap=overlap,
                            attention=None if attention in (None, "xla") else attention)
        if attention == "xla":  # no route of its own: none, whatever the backend's default
            paged.attention = None
        kv = paged.kv_bytes
        key = jax.random.key(seed)

        def once():
            requests = [Request(p, limit, jax.random.fold_in(key, i), n=generations,
                                sample_limits=tuple(lengths[i * generations:(i + 1) * generations]))
                        for i, p in enumerate(next(at))]
            return paged.run(requests, temperature=1.0)
    times, compiles, totals, extra = [], [], {}, {}
    counter = compile_counter()
    if warmup and engine == "paged":
        with counter:
            start = time.perf_counter()
            paged.warmup(temperature=1.0)
            extra.update(warmup_s=time.perf_counter() - start, warmup_programs=counter.programs,
                         warmup_compile_s=counter.compile_s)
        log(f"warmup: {extra['warmup_s']:.1f} s, {counter.programs} programs traced")
    traces = []  # the engine's own programs traced in each rollout
    for i in range(1 + repeats):
        jax.block_until_ready(jnp.zeros(()))
        before = sum(TRACES.values())
        with counter:
            start = time.perf_counter()
            out = once()
            times.append(time.perf_counter() - start)
        compiles.append((counter.programs, counter.compile_s))
        traces.append(sum(TRACES.values()) - before)
        if engine == "paged" and (i > 0 or not repeats):
            for k in ("decode_calls", "decode_steps", "host_waits", "wasted_row_steps",
                      "row_steps"):
                totals[k] = totals.get(k, 0) + paged.stats[k]
        log(f"rollout {i}: {times[-1]:.1f} s, {counter.programs} programs traced, "
            f"{counter.compile_s:.1f} s compiling")
    made = (sum(len(s.tokens) for row in out for s in row) if engine == "paged"
            else sum(min(len(o.tokens), n) for o, n in zip(out, lengths)))
    tokens = sum(lengths)
    assert made == tokens, (made, tokens)  # every sample ran to its drawn length
    median = float(np.median(times[1:])) if repeats else times[0]
    extra.update(workload=workload, engine=engine, kv_bytes=kv, generations=generations,
                 limit=limit, prompt_len=prompt_len if prompt_lens is None else list(prompt_lens),
                 mean_length=float(np.mean(lengths)))
    extra.update(programs=compiles[0][0], compile_s=compiles[0][1],
                 later_programs=sum(c[0] for c in compiles[1:]))
    if engine == "paged":
        extra.update(engine_programs=traces[0], later_engine_programs=sum(traces[1:]))
    if engine == "paged":
        extra.update(max_seqs=max_seqs, num_pages=paged.num_pages,
                     preempted=paged.stats["preempted"],
                     peak_pages=paged.stats["peak_pages"], page_size=paged.page_size,
                     window=paged.sync_steps, overlap=paged.overlap,
                     attention=paged.attention or "xla",
                     windows=totals["decode_calls"], decode_steps=totals["decode_steps"],
                     host_waits=totals["host_waits"], row_steps=totals["row_steps"],
                     wasted_row_steps=totals["wasted_row_steps"])
    return Measured(first_s=times[0], median_s=median, tokens=tokens,
                    flops=asked_flops(cfg, [len(p) for p in prompt_sets[-1]], lengths),
                    extra=extra)


def asked_flops(cfg, prompt_len, lengths) -> float:
    """The FLOPs of the work asked for: each sample's prompt and its own length (what a static
    row or Tunix's sampler decodes past its length is not counted). prompt_len: one length for
    all, or each prompt's (its samples follow it in `lengths`)."""
    per = len(lengths) // (len(prompt_len) if isinstance(prompt_len, list) else 1)
    return sum(flops.decode_flops(cfg, 1, prompt_len[i // per] if isinstance(prompt_len, list)
                                  else prompt_len, n) for i, n in enumerate(lengths))


def tunix_row(workload: str, *, prompts: int = 32, generations: int = 8, prompt_len: int = 64,
              limit: int = 512, repeats: int = 1, seed: int = 0,
              log: Callable = quiet) -> Measured:
    """The workload on Tunix's vanilla sampler (module docstring): SmolLM2-135M's shape, random
    init, fp32, in a process of the Tunix venv. An InputError outside a source checkout."""
    from hone.errors import InputError
    from hone.models.config import preset
    root = Path(__file__).resolve().parents[2] / "benchmarks"
    script = root / "rollout_tunix.py"
    if not script.exists():
        raise InputError("--tunix runs benchmarks/rollout_tunix.py in the Tunix venv: it needs "
                         "hone's source checkout, not an installed package")
    log("rollout: the Tunix venv (benchmarks/_venvs.py; made on first use, minutes)")
    made = subprocess.run([sys.executable, str(root / "_venvs.py")], capture_output=True,
                          text=True)
    if made.returncode != 0:
        raise RuntimeError(f"the Tunix venv could not be made:\n{made.stderr[-2000:]}")
    python = made.stdout.strip().splitlines()[-1]
    log(f"rollout: {workload} on Tunix's sampler, {prompts} prompts x {generations} of "
        f"{limit} tokens")
    done = subprocess.run([python, str(script), "--workload", workload, "--prompts", str(prompts),
                           "--generations", str(generations), "--prompt-len", str(prompt_len),
                           "--limit", str(limit), "--repeats", str(repeats), "--seed", str(seed)],
                          capture_output=True, text=True, cwd=root)
    if done.returncode != 0:
        raise RuntimeError(f"rollout_tunix.py failed:\n{done.stderr[-2000:]}")
    got = json.loads(done.stdout.strip().splitlines()[-1])
    lengths = sample_lengths(workload, prompts * generations, limit, seed)
    work = asked_flops(preset("smollm2-135m"), prompt_len, lengths)  # rollout_tunix.py's shape
    median = got["median_s"] if repeats else got["first_s"]
    return Measured(first_s=got["first_s"], median_s=median, tokens=sum(lengths), flops=work,
                    peak_mb=got["peak_rss_mb"],
                    extra={"workload": workload, "engine": "tunix", "kv_bytes": got["kv_bytes"],
                           "generations": generations, "limit": limit, "prompt_len": prompt_len})
