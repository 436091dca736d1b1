"""Decode windows on the device (hone/sampling/paged.py `decode_window`) and the host off their
path (hone/sampling/scheduler.py): the tokens and log-probabilities of a rollout do not depend on
the window's length, on whether window k+1 goes out before window k is read (stops seen a window
late), or on a fixed trip count; rows that stop mid-window are masked and counted; one blocking
read per window.

Every comparison is against the engine with 8-step windows read at once (what it did before
windows moved to the device), on samples cut by end tokens at ragged places, with episodes,
preemption and several samples per prompt, so a token written past a stop, a first token read
twice or a row carried into the wrong place changes something here."""

import jax
import numpy as np
import pytest
from test_generate import TOL, mixed_prompts
from test_paged_turns import environment

import hone
from hone.sampling.scheduler import PagedEngine, Request

# The engine's default (16-step windows on the CPU, overlap) runs in every other paged test.
SETTINGS = {"w1": dict(sync_steps=1, overlap=False), "w5 overlap": dict(sync_steps=5, overlap=True),
            "w3 fixed overlap": dict(sync_steps=3, overlap=True, fixed=True)}


@pytest.fixture(scope="module")
def tiny():
    return hone.load_model("tiny")


def engine(model, fixed=False, **kw):
    eng = PagedEngine(model, page_size=4, **kw)
    eng.fixed_window = fixed  # a GPU's fixed trip count, on this CPU
    return eng


def rollout(model, *, episodes=False, **kw):
    key = jax.random.key(5)
    prompts = mixed_prompts(6, seed=4)
    requests = [Request(p, 24, jax.random.fold_in(key, i), n=3,
                        turn_tokens=7 if episodes else None) for i, p in enumerate(prompts)]
    on_turn = environment(2)[0] if episodes else None
    eng = engine(model, **kw)
    out = eng.run(requests, temperature=1.0, eos_ids=(5, 9), on_turn=on_turn)
    return out, eng


def assert_same(a, b):
    for row_a, row_b in zip(a, b):
        for x, y in zip(row_a, row_b):
            assert x.tokens == y.tokens and x.model_mask == y.model_mask
            assert x.finish_reason == y.finish_reason and x.turns == y.turns
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=TOL)
            np.testing.assert_allclose(x.sampling_logprobs, y.sampling_logprobs, rtol=0,
                                       atol=TOL)


@pytest.mark.parametrize("episodes", [False, True], ids=["single turns", "episodes"])
def test_tokens_do_not_depend_on_windows_or_overlap(tiny, episodes):
    base, _ = rollout(tiny, episodes=episodes, max_seqs=4, sync_steps=8, overlap=False)
    samples = [s for row in base for s in row]
    if not episodes:  # stops at ragged places, by an end token and by the budget
        assert {s.finish_reason for s in samples} == {"eos", "length"}
    for name, kw in SETTINGS.items():
        out, eng = rollout(tiny, episodes=episodes, max_seqs=4, **kw)
        assert_same(base, out)
        assert eng.alloc.used == 0 and sorted(eng.free_places) == [0, 1, 2, 3], name


def test_masked_row_steps_are_counted(tiny):
    """Row-steps run = tokens the windows emitted + row-steps wasted (masked rows, padding):
    the first token of each turn is drawn before the window, the rest in it."""
    for name, kw in SETTINGS.items():
        out, eng = rollout(tiny, max_seqs=4, **kw)
        samples = [s for row in out for s in row]
        emitted = sum(len(s.tokens) for s in samples) - len(samples)  # less each first token
        st = eng.stats
        assert st["row_steps"] - st["wasted_row_steps"] == emitted, name
        assert st["wasted_row_steps"] > 0
        if kw.get("fixed"):  # every window runs all its steps
            assert st["decode_steps"] == st["decode_calls"] * kw["sync_steps"]


def test_one_blocking_read_per_window(tiny):
    """Without preemption the host waits for the device once a window (its tokens), never at
    a prefill or a first token; a window reads out with its tokens the first tokens drawn
    before it."""
    for overlap in (False, True):
        out, eng = rollout(tiny, max_seqs=4, sync_steps=4, overlap=overlap)
        assert eng.stats["preempted"] == 0
        # The last window out when the rollout ends holds only stopped rows: not read.
        assert eng.stats["decode_calls"] - int(overlap) <= eng.stats["host_waits"]
        assert eng.stats["host_waits"] <= eng.stats["decode_calls"]


def test_preemption_with_a_window_out(tiny):
    """A pool that holds about two sequences: preempting while a window is out reads it
    first; the samples are those of a pool that never runs out."""
    roomy, _ = rollout(tiny, max_seqs=4, sync_steps=8, overlap=False)
    tight, eng = rollout(tiny, max_seqs=4, num_pages=18, sync_steps=3, overlap=True)
    assert eng.stats["preempted"] > 0
    assert_same(roomy, tight)
    assert eng.alloc.used == 0
