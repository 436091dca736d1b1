"""Episodes on the paged engine: a sample's turns and the tokens appended between them, its
pages kept across turns (its history never prefilled again), log-probabilities equal to a
teacher-forced pass over the whole episode, and tokens that depend on neither max_seqs nor
preemption."""

import jax
import numpy as np
import pytest
from test_generate import TOL, mixed_prompts, teacher_forced

import hone
from hone.sampling.scheduler import PagedEngine, Request


@pytest.fixture(scope="module")
def tiny():
    return hone.load_model("tiny")


def environment(turns=3):
    """Appends 2 + (request + sample + turn) % 3 tokens after each of the first `turns` model
    turns, then ends the episode; records what it saw."""
    seen = []

    def on_turn(turn):
        seen.append(turn)
        done = sum(1 for t in seen if (t.request, t.sample) == (turn.request, turn.sample))
        if done > turns:
            return None
        k = 2 + (turn.request + turn.sample + done) % 3
        return [20 + turn.request, 30 + done] + [40] * (k - 2)

    return on_turn, seen


def play(model, prompts, *, turns=3, **engine):
    key = jax.random.key(11)
    requests = [Request(p, 40, jax.random.fold_in(key, i), n=2, turn_tokens=6)
                for i, p in enumerate(prompts)]
    on_turn, seen = environment(turns)
    eng = PagedEngine(model, page_size=4, **engine)
    out = eng.run(requests, temperature=1.0, eos_ids=(5,), on_turn=on_turn)
    return out, eng, seen


def test_episode_turns_append_tokens_into_kept_pages(tiny):
    prompts = mixed_prompts(5, seed=8)
    out, eng, seen = play(tiny, prompts, max_seqs=4)
    samples = [s for row in out for s in row]
    assert eng.alloc.used == 0 and eng.stats["preempted"] == 0
    assert all(s.turns == 4 for s in samples)  # three appended turns, then the callback ends it
    appended = 0
    for s in samples:
        assert len(s.tokens) == len(s.model_mask) == len(s.logprobs)
        model_runs = np.diff(np.concatenate([[0], s.model_mask, [0]]))
        assert np.sum(model_runs == 1) == 4  # four model turns between the appended tokens
        appended += len(s.model_mask) - sum(s.model_mask)
    for t in seen:  # each turn as the callback saw it: at most turn_tokens, eos only at its end
        assert 1 <= len(t.tokens) <= 6 and 5 not in t.tokens[:-1]
        assert (t.reason == "eos") == (t.tokens[-1] == 5)
    # Pages kept across turns: what was prefilled is the prompts and, per appended turn, its
    # model turn's last token and the appended tokens; never the history again.
    turns_appended = sum(s.turns - 1 for s in samples)
    assert eng.stats["prefill_tokens"] == sum(map(len, prompts)) + turns_appended + appended
    flat = [p for p in prompts for _ in range(2)]
    for tf, s in zip(teacher_forced(tiny, flat, [s.tokens for s in samples]), samples):
        mask = np.array(s.model_mask, bool)
        assert np.abs(tf[mask] - np.array(s.logprobs)[mask]).max() <= TOL
        assert np.all(np.array(s.logprobs)[~mask] == 0)


def test_episodes_do_not_depend_on_max_seqs_or_preemption(tiny):
    prompts = mixed_prompts(4, seed=9)
    base, _, _ = play(tiny, prompts, max_seqs=1)
    for engine in ({"max_seqs": 3}, {"max_seqs": 8}, {"max_seqs": 4, "num_pages": 20}):
        out, eng, _ = play(tiny, prompts, **engine)
        assert [[s.tokens for s in row] for row in out] == [[s.tokens for s in row]
                                                             for row in base], engine
        if "num_pages" in engine:
            assert eng.stats["preempted"] > 0
        assert eng.alloc.used == 0


def test_a_continued_sample_draws_what_it_would_have_drawn_without_stopping(tiny):
    """Request.resume + first_sample: sample j of a request, stopped after k tokens and
    continued (its history prefilled again), ends with the tokens of the uninterrupted run."""
    prompts = mixed_prompts()[:3]
    whole, _, _ = play(tiny, prompts, turns=0)  # single turns of up to 6 tokens
    key = jax.random.key(11)
    later, where = [], []
    for i, p in enumerate(prompts):
        for j, s in enumerate(whole[i]):
            k = len(s.tokens) // 2
            if k == 0:
                continue
            so_far = hone.sampling.requests.Sample(tokens=s.tokens[:k], logprobs=s.logprobs[:k],
                                                   model_mask=s.model_mask[:k])
            later.append(Request(p, 40, jax.random.fold_in(key, i), turn_tokens=6 - k,
                                 first_sample=j, resume=(so_far,)))
            where.append((i, j, k))
    assert len(where) >= 4
    out = PagedEngine(tiny, page_size=4, max_seqs=2).run(later, temperature=1.0, eos_ids=(5,))
    for (i, j, k), (s,) in zip(where, out):
        assert s.tokens == whole[i][j].tokens
        np.testing.assert_allclose(s.logprobs[k:], whole[i][j].logprobs[k:], atol=TOL)
    with pytest.raises(hone.errors.InputError, match="resume"):
        PagedEngine(tiny, page_size=4).run([Request(prompts[0], 3, key, resume=(
            hone.sampling.requests.Sample(tokens=[1, 2, 3], logprobs=[0.0] * 3,
                                          model_mask=[1] * 3),))])
