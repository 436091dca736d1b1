"""The paged rollout engine: log-probabilities equal to a teacher-forced forward pass, samples
that do not depend on max_seqs or on preemption, shared prompt pages, a pool that ends empty.
Greedy tokens equal transformers' and the static sampler's for every family:
tests/sampling/test_generate.py's test_greedy_matches_transformers_generate (one model each)."""

import jax
import numpy as np
import pytest
from flax import nnx
from test_generate import TOL, assert_teacher_forced, mixed_prompts, teacher_forced

import hone
from hone.errors import InputError
from hone.sampling.generate import generate
from hone.sampling.paged import TRACES
from hone.sampling.scheduler import PagedEngine, Request


@pytest.fixture(scope="module")
def tiny():
    return hone.load_model("tiny")


def run(model, prompts, *, n=1, new=8, seed=0, temperature=1.0, eos_ids=(), **engine):
    key = jax.random.key(seed)
    requests = [Request(p, new, jax.random.fold_in(key, i), n=n, policy_version=3)
                for i, p in enumerate(prompts)]
    eng = PagedEngine(model, **engine)
    out = eng.run(requests, temperature=temperature, eos_ids=eos_ids)
    return out, eng


def test_mixture_of_experts_greedy_equals_static():
    model = hone.load_model("tiny-moe")
    prompts = mixed_prompts(6)
    paged = generate(model, None, prompts, max_new_tokens=6, eos_ids=(), engine="paged",
                     max_seqs=4)
    static = generate(model, None, prompts, max_new_tokens=6, eos_ids=())
    assert [o.tokens for o in paged] == [o.tokens for o in static]
    assert_teacher_forced(model, prompts, paged)


def test_samples_do_not_depend_on_max_seqs(tiny):
    """Sampled (temperature 1), 3 samples per prompt, ragged prompts and lengths cut by an end
    token: the same tokens and log-probabilities with 1, 3, 8 or 64 slots."""
    prompts = mixed_prompts(7, seed=3)
    runs = {}
    for max_seqs in (1, 3, 8, 64):
        out, eng = run(tiny, prompts, n=3, new=12, eos_ids=(5, 7), max_seqs=max_seqs,
                       page_size=4)
        runs[max_seqs] = out
        assert eng.alloc.used == 0  # every page back in the pool
    first = runs[1]
    for max_seqs, out in runs.items():
        for r0, r1 in zip(first, out):
            assert [s.tokens for s in r0] == [s.tokens for s in r1], max_seqs
            for a, b in zip(r0, r1):
                np.testing.assert_allclose(a.logprobs, b.logprobs, rtol=0, atol=1e-6)
    samples = [s for row in first for s in row]
    assert len({tuple(s.tokens) for s in samples}) > len(prompts)  # samples of a prompt differ
    assert any(s.finish_reason == "eos" for s in samples)
    assert all(s.policy_version == 3 for s in samples)
    flat_prompts = [p for p in prompts for _ in range(3)]
    tf = teacher_forced(tiny, flat_prompts, [s.tokens for s in samples])
    for lp, s in zip(tf, samples):
        assert np.abs(lp - np.array(s.logprobs)).max() <= TOL


def test_preemption_under_a_tiny_pool_changes_nothing(tiny):
    """A pool that holds about two sequences for 4 slots: sequences are preempted and
    recomputed, counted, and the samples are those of a pool that never runs out."""
    prompts = mixed_prompts(6, seed=5)
    roomy, _ = run(tiny, prompts, n=2, new=16, max_seqs=4, page_size=4)
    tight, eng = run(tiny, prompts, n=2, new=16, max_seqs=4, page_size=4, num_pages=16)
    assert eng.stats["preempted"] > 0
    assert sum(s.preempted for row in tight for s in row) == eng.stats["preempted"]
    assert [[s.tokens for s in row] for row in tight] == [[s.tokens for s in row]
                                                           for row in roomy]
    for a, b in zip(roomy, tight):
        for x, y in zip(a, b):
            np.testing.assert_allclose(x.logprobs, y.logprobs, rtol=0, atol=TOL)
    assert eng.alloc.used == 0


def test_samples_share_their_prompt_pages(tiny):
    """8 samples of a 21-token prompt with pages of 4: its 5 full pages are held once (8
    references each), each sample copies the partly filled sixth; the samples equal those of
    pages too large to share (one partly filled page, copied by every sample)."""
    prompt = mixed_prompts(1, seed=9)[0]
    prompt = (prompt * 5)[:21]
    shared, eng = run(tiny, [prompt], n=8, new=4, max_seqs=8, page_size=4)
    whole, _ = run(tiny, [prompt], n=8, new=4, max_seqs=8, page_size=64)
    assert [s.tokens for s in shared[0]] == [s.tokens for s in whole[0]]
    # Without sharing 8 x 7 pages would be held at the peak (21 + 4 slots each).
    assert eng.stats["peak_pages"] <= 6 + 8 * 2
    assert eng.alloc.used == 0


def test_no_recompilation_for_new_weights(tiny):
    prompts = mixed_prompts(4, seed=1)
    run(tiny, prompts, max_seqs=4)
    before = dict(TRACES)
    graphdef, state = nnx.split(hone.load_model("tiny"))
    moved = jax.tree.map(lambda x: x * 1.01 if x.dtype == np.float32 else x, state)
    run(nnx.merge(graphdef, moved), prompts, max_seqs=4)
    assert dict(TRACES) == before


def test_bad_input(tiny):
    with pytest.raises(InputError, match="max_seqs"):
        generate(tiny, None, [[1, 2]], engine="paged", max_seqs=0)
    with pytest.raises(InputError, match="engine"):
        generate(tiny, None, [[1, 2]], engine="vllm")
    with pytest.raises(InputError, match="cannot hold one sequence"):
        run(tiny, [[1, 2, 3]], new=40, page_size=4, num_pages=4)
