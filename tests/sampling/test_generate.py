"""The KV-cache sampler: exact against transformers' greedy generate and against teacher-forced
log-probabilities, reproducible by seed, compiled once per bucket, strict about its inputs."""

import functools

import jax
import numpy as np
import pytest
from flax import nnx
from reference import CASES, hf_greedy, hf_model

import hone
from hone.errors import InputError
from hone.models.attention import DECODE_BLOCK
from hone.sampling.engine import TRACES
from hone.sampling.generate import generate
from hone.sampling.scheduler import PagedEngine, Request

TOL = 1e-4  # fixed; never loosened


def mixed_prompts(n=16, vocab=97, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(1, vocab, rng.integers(1, 13)).tolist() for _ in range(n)]


@functools.partial(jax.jit, static_argnums=0)
def _log_softmax_of(graphdef, state, tokens, mask):
    return jax.nn.log_softmax(nnx.merge(graphdef, state)(tokens, attention_mask=mask), axis=-1)


def teacher_forced(model, prompts, completions) -> list[np.ndarray]:
    """log p of each completion token given its prompt and the completion so far, from one
    forward pass over all rows (right-padded to a multiple of 32 slots, so the tests share
    few compiled programs; causal attention keeps padding out of the real tokens' values)."""
    seqs = [p + c for p, c in zip(prompts, completions)]
    width = -(-max(map(len, seqs)) // 32) * 32
    tokens, mask = np.zeros((len(seqs), width), np.int32), np.zeros((len(seqs), width), np.int32)
    for i, s in enumerate(seqs):
        tokens[i, :len(s)], mask[i, :len(s)] = s, 1
    lp = np.asarray(_log_softmax_of(*nnx.split(model), tokens, mask))
    return [np.array([lp[i, len(p) - 1 + j, t] for j, t in enumerate(c)])
            for i, (p, c) in enumerate(zip(prompts, completions))]


def assert_teacher_forced(model, prompts, outs) -> None:
    """Every sampled log-probability equals the teacher-forced one (TOL)."""
    for tf, o in zip(teacher_forced(model, prompts, [o.tokens for o in outs]), outs):
        assert np.abs(tf - np.array(o.logprobs)).max() <= TOL


@pytest.mark.parametrize("name", list(CASES))
def test_greedy_matches_transformers_generate(name, tmp_path):
    """Both engines: the static sampler, and the paged engine with 16 prompts through 5 slots
    and pages of 4 slots (continuous batching, several pages per sequence and across the
    sliding windows of gemma2/3)."""
    ref, folder = hf_model(name, tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts()
    outs = generate(model, None, prompts, max_new_tokens=8, eos_ids=())
    assert [o.tokens for o in outs] == hf_greedy(ref, prompts, 8)
    assert_teacher_forced(model, prompts, outs)
    key = jax.random.key(0)
    paged = PagedEngine(model, max_seqs=5, page_size=4).run(
        [Request(p, 8, jax.random.fold_in(key, i)) for i, p in enumerate(prompts)],
        temperature=0.0)
    assert [row[0].tokens for row in paged] == [o.tokens for o in outs]
    for row, o in zip(paged, outs):
        np.testing.assert_allclose(row[0].logprobs, o.logprobs, rtol=0, atol=TOL)


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_sampled_logprobs_equal_teacher_forced(name, tmp_path):
    _, folder = hf_model(name, tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts(n=5, seed=1)
    outs = generate(model, None, prompts, max_new_tokens=10, temperature=0.8, top_k=20,
                    top_p=0.9, seed=7, eos_ids=())
    assert_teacher_forced(model, prompts, outs)
    for o in outs:
        # The truncated, tempered distribution is sharper than the model's own.
        assert all(s <= 0.0 for s in o.sampling_logprobs)
        assert np.mean(o.sampling_logprobs) > np.mean(o.logprobs)


def test_seeds(tmp_path):
    _, folder = hf_model("qwen3", tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts(n=4, seed=2)
    run = lambda seed: [o.tokens for o in generate(model, None, prompts, max_new_tokens=12,  # noqa: E731
                                                   temperature=1.0, seed=seed, eos_ids=())]
    assert run(0) == run(0)
    assert run(0) != run(1)


def test_streaming_gives_the_same_samples(tmp_path):
    _, folder = hf_model("gemma2", tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts(n=3, seed=3)
    seen = []
    kw = dict(max_new_tokens=9, temperature=1.0, top_p=0.95, seed=5, eos_ids=())
    streamed = generate(model, None, prompts, on_step=lambda t: seen.append(t.shape[1]), **kw)
    plain = generate(model, None, prompts, **kw)
    assert [o.tokens for o in streamed] == [o.tokens for o in plain]
    assert seen == list(range(2, 10))


def test_eos_stops_a_row_and_is_reported(tmp_path):
    _, folder = hf_model("llama", tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts(n=4, seed=4)
    free = generate(model, None, prompts, max_new_tokens=8, eos_ids=())
    eos = free[0].tokens[2]  # make the third token of row 0 an end-of-sequence token
    outs = generate(model, None, prompts, max_new_tokens=8, eos_ids=(eos,))
    assert outs[0].finish_reason == "eos"
    assert outs[0].tokens == free[0].tokens[: free[0].tokens.index(eos) + 1]
    for f, o in zip(free[1:], outs[1:]):
        if eos not in f.tokens:
            assert o.tokens == f.tokens and o.finish_reason == "length"


@pytest.mark.parametrize("name, n", [("llama", 4), ("gemma3_text", 3)])
def test_n_samples_per_prompt_are_those_of_the_prompts_listed_n_times(name, n, tmp_path):
    # One prefill per prompt, its cache rows repeated: the same samples as a batch that lists
    # every prompt n times, with log-probabilities still equal to teacher-forced ones.
    _, folder = hf_model(name, tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts(n=3, seed=6)
    kw = dict(max_new_tokens=10, temperature=1.0, top_k=30, seed=3, eos_ids=())
    shared = generate(model, None, prompts, n=n, **kw)
    listed = generate(model, None, [p for p in prompts for _ in range(n)], **kw)
    assert len(shared) == 3 * n
    assert [o.tokens for o in shared] == [o.tokens for o in listed]
    assert len({tuple(o.tokens) for o in shared[:n]}) > 1  # the n copies sample differently
    for i, o in enumerate(shared):
        assert np.abs(np.array(o.logprobs) - np.array(listed[i].logprobs)).max() <= 1e-5
    assert_teacher_forced(model, [p for p in prompts for _ in range(n)], shared)


def test_no_recompilation_for_same_buckets_or_new_weights():
    model = hone.load_model("tiny")
    generate(model, None, [[1, 2, 3], [4, 5]], max_new_tokens=5)
    before = dict(TRACES)
    generate(model, None, [[7, 8, 9, 10], [1]], max_new_tokens=7)  # same buckets
    other = hone.load_model("tiny", seed=1)  # new weights, same architecture
    generate(other, None, [[3, 3], [9]], max_new_tokens=6)
    assert dict(TRACES) == before


def test_sliding_window_ring_buffer_beyond_window(tmp_path):
    # Prompts and completions several windows long: the ring buffer keeps only W keys.
    ref, folder = hf_model("gemma3_text", tmp_path)
    model = hone.load_model(folder)
    prompts = mixed_prompts(n=3, seed=5)
    outs = generate(model, None, prompts, max_new_tokens=20, eos_ids=())
    assert [o.tokens for o in outs] == hf_greedy(ref, prompts, 20)


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_cache_longer_than_a_block(name, tmp_path):
    # Prompts up to 40 tokens (bucket 64) and 20 new ones (bucket 32): a 96-slot cache that a
    # decode step reads in blocks of DECODE_BLOCK slots, the last block overlapping the one
    # before it; long left padding leaves whole blocks of a short prompt's row empty.
    assert DECODE_BLOCK < 96 < 2 * DECODE_BLOCK
    ref, folder = hf_model(name, tmp_path)
    model = hone.load_model(folder)
    rng = np.random.default_rng(11)
    prompts = [rng.integers(1, 97, n).tolist() for n in (40, 3, 33, 17, 1, 39)]
    outs = generate(model, None, prompts, max_new_tokens=20, eos_ids=())
    assert [o.tokens for o in outs] == hf_greedy(ref, prompts, 20)
    assert_teacher_forced(model, prompts, outs)


@pytest.mark.parametrize("kwargs, key", [
    (dict(prompts=[]), "prompts"),
    (dict(prompts=[[]]), "prompts[0]"),
    (dict(prompts=[[1] * 600]), "prompts[0]"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_k=0), "top_k"),
    (dict(temperature=-1.0), "temperature"),
    (dict(prompts=["text"]), "prompts[0]"),
    (dict(n=0), "n"),
    (dict(prefill_chunk=0), "prefill_chunk"),
])
def test_bad_input_is_refused_before_compiling(kwargs, key):
    model = hone.load_model("tiny")
    args = dict(prompts=[[1, 2]], max_new_tokens=4)
    args.update(kwargs)
    before = dict(TRACES)
    with pytest.raises(InputError, match=key.replace("[", r"\[").replace("]", r"\]")):
        generate(model, None, **args)
    assert dict(TRACES) == before
