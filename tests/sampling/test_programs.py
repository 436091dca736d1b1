"""Few programs (hone/sampling/scheduler.py `PagedEngine.programs`, `warmup`): the rollout engine
compiles a fixed set of programs (decode windows of a handful of row counts, prefill calls of a
handful of block counts, one page copy, one first-token draw), whatever the prompts' lengths;
`warmup` compiles them all, and nothing compiles after it: not a rollout of prompts of 16 to 200
tokens, not one of other lengths with new weights. Counted with jax.monitoring's trace events
(every program of the process, the eager ones too) and the engine's own trace counters."""

import jax
import numpy as np

import hone
from hone.bench.rollout import compile_counter
from hone.sampling import paged
from hone.sampling.buckets import block_bucket, block_buckets, row_bucket, row_buckets
from hone.sampling.scheduler import PagedEngine, Request


def requests(seed: int, count: int = 6) -> list[Request]:
    """Prompts of 16 to 200 tokens (an RL batch's spread), 3 samples each."""
    rng = np.random.default_rng(seed)
    key = jax.random.key(seed)
    return [Request(rng.integers(3, 200, int(rng.integers(16, 201))).tolist(), 20,
                    jax.random.fold_in(key, i), n=3) for i in range(count)]


def engine_traces(before: dict) -> dict:
    return {k: v - before.get(k, 0) for k, v in paged.TRACES.items() if v != before.get(k, 0)}


def test_buckets():
    assert row_buckets(64) == [16, 32, 48, 64]
    assert row_buckets(256) == [16, 32, 48, 64, 96, 128, 192, 256]
    assert row_buckets(6) == [6] and row_bucket(3, 6) == 6
    assert [row_bucket(n, 100) for n in (1, 17, 33, 49, 65, 99)] == [16, 32, 48, 64, 96, 100]
    assert block_buckets(32) == [1, 2, 4, 8, 16, 32]
    assert block_buckets(12) == [1, 2, 4, 8, 12] and block_bucket(9, 12) == 12
    assert all(row_bucket(n, 64) in row_buckets(64) for n in range(1, 65))
    assert all(block_bucket(n, 12) in block_buckets(12) for n in range(1, 13))


def test_warmup_compiles_everything_once():
    model = hone.load_model("tiny")
    eng = PagedEngine(model, max_seqs=20, page_size=8, max_len=256, prefill_chunk=128)
    assert eng.programs() == {"rows": [16, 20], "blocks": [1, 2, 4]}
    counter, before = compile_counter(), dict(paged.TRACES)
    with counter:
        eng.warmup(temperature=1.0, eos_ids=(5, 9))
    assert engine_traces(before) == {"prefill_chunk": 3, "decode_window": 2, "choose_first": 1,
                                     "copy_pages": 1}
    before = dict(paged.TRACES)
    for seed in range(2):  # prompts of other lengths each time, chunked past 128 tokens
        with counter:
            out = eng.run(requests(seed), temperature=1.0, eos_ids=(5, 9))
        assert counter.programs == 0, f"rollout {seed} compiled {counter.programs} programs"
        assert all(len(s.tokens) > 0 for row in out for s in row)
    assert eng.stats["prefill_calls"] > 1 and eng.stats["decode_calls"] > 1
    eng.model = hone.load_model("tiny", seed=3)  # new weights: arguments, not constants
    with counter:
        eng.run(requests(2), temperature=1.0, eos_ids=(5, 9))
    assert counter.programs == 0 and engine_traces(before) == {}


def test_a_rollout_compiles_at_most_the_set():
    """Without warmup a rollout compiles part of the set (what its shapes needed); a warmup
    after it compiles the rest, and the next rollout nothing."""
    model = hone.load_model("tiny", seed=1)
    eng = PagedEngine(model, max_seqs=16, page_size=8, max_len=256, prefill_chunk=256)
    every = len(eng.programs()["rows"]) + len(eng.programs()["blocks"]) + 2
    assert every <= 12
    counter, before = compile_counter(), dict(paged.TRACES)
    with counter:
        eng.run(requests(3, count=8), temperature=0.7, top_p=0.9, eos_ids=(5,))
    first = sum(engine_traces(before).values())
    assert 4 <= first <= every
    eng.warmup(temperature=0.7, top_p=0.9, eos_ids=(5,))
    assert sum(engine_traces(before).values()) == every
    with counter:
        eng.run(requests(4, count=8), temperature=0.7, top_p=0.9, eos_ids=(5,))
    assert counter.programs == 0
