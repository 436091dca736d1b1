"""One row per preference pair ([prompt | chosen | rejected], prompt scored once) against the two
rows per pair it replaces: the same layout facts by hand, and the same log-probabilities, DPO
losses and gradients on random tiny models (a sliding-window one too) to 1e-5."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from hypothesis import given, settings
from hypothesis import strategies as st

from hone.config import DPOConfig, load_config
from hone.data.preference import Pair, PreferenceData, pair_batch, pair_rows
from hone.data.shared_prefix import shared_rows, shared_sizes, work_tokens
from hone.models.config import preset
from hone.models.transformer import Transformer
from hone.tokenizer import load_tokenizer
from hone.train.dpo_objective import make_dpo_loss, sequence_logps
from hone.train.state import flatten

PAD = 0


def pair(p, c, r):
    return Pair(np.array(p, np.int32), np.array(c, np.int32), np.array(r, np.int32))


def test_layout_by_hand():
    out = shared_rows([pair([5, 6, 7], [8, 9], [10, 11, 12])], PAD)
    # Row: 3 prompt + 2 chosen + 3 rejected = 8 slots (S rounds up to 8), K = 8.
    assert out["tokens"][0].tolist() == [5, 6, 7, 8, 9, 10, 11, 12]
    assert out["positions"][0].tolist() == [0, 1, 2, 3, 4, 3, 4, 5]
    assert out["branch_ids"][0].tolist() == [0, 0, 0, 1, 1, 2, 2, 2]
    assert out["attention_mask"][0].tolist() == [1] * 8
    # Chosen 8 is predicted at slot 2 (the last prompt token), 9 at slot 3; rejected 10 at
    # slot 2 as well, 11 at slot 5, 12 at slot 6.
    assert out["score_index"][0, 0, :2].tolist() == [2, 3]
    assert out["score_index"][0, 1, :3].tolist() == [2, 5, 6]
    assert out["score_targets"][0, 0, :2].tolist() == [8, 9]
    assert out["score_mask"][0].sum(axis=1).tolist() == [2, 3]
    assert shared_sizes([pair([1] * 9, [2], [3])]) == (16, 8)


def test_work_tokens_count_a_shared_row_as_its_two_rows():
    """tokens/s counts the work a batch stands for: the shared row's prompt once per answer,
    as the two-row layout holds it. By hand: (3 + 2) + (3 + 3) = 11 of the row's 8 tokens."""
    pairs = [pair([5, 6, 7], [8, 9], [10, 11, 12]), pair([4], [3, 2, 1], [9])]
    two_rows = pair_rows(pairs, 8, PAD)
    assert work_tokens(shared_rows(pairs[:1], PAD)) == 11
    assert work_tokens(shared_rows(pairs, PAD)) == work_tokens(two_rows) == 11 + 4 + 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 12), st.integers(1, 9), st.integers(1, 9)),
                min_size=1, max_size=5))
def test_every_answer_token_is_scored_from_the_slot_before_it_in_its_own_sequence(sizes):
    """Rebuild each answer's own sequence (prompt + answer) from the row: the scored slots must
    be exactly that sequence's previous tokens, and the positions its own positions."""
    rng = np.random.default_rng(len(sizes))
    pairs = [pair(*(rng.integers(1, 99, n) for n in s)) for s in sizes]
    out = shared_rows(pairs, PAD)
    for n, pr in enumerate(pairs):
        for side, (branch, answer) in enumerate(((1, pr.chosen), (2, pr.rejected))):
            own = np.concatenate([pr.prompt, answer])
            slots = np.flatnonzero(np.isin(out["branch_ids"][n], (0, branch))
                                   & (out["attention_mask"][n] == 1))
            assert out["tokens"][n, slots].tolist() == own.tolist()
            assert out["positions"][n, slots].tolist() == list(range(len(own)))
            a = len(answer)
            idx = out["score_index"][n, side, :a]
            assert out["tokens"][n, idx].tolist() == own[len(pr.prompt) - 1:-1].tolist()
            assert out["score_targets"][n, side, :a].tolist() == answer.tolist()
            assert out["score_mask"][n, side].sum() == a


def _models():
    tiny = preset("tiny")
    sliding = dataclasses.replace(tiny, num_layers=3, sliding_window=4,
                                  layer_types=("sliding", "global", "sliding"))
    return {"tiny": tiny, "sliding window 4": sliding}


def _random_pairs(n, seed, vocab):
    rng = np.random.default_rng(seed)
    return [pair(*(rng.integers(1, vocab, rng.integers(1, top)) for top in (14, 9, 9)))
            for _ in range(n)]


@pytest.mark.parametrize("name", list(_models()))
def test_sequence_logprobs_equal_the_two_row_layout(name):
    cfg = _models()[name]
    model = Transformer(cfg, rngs=nnx.Rngs(3))
    pairs = _random_pairs(6, 0, cfg.vocab_size)
    rows = pair_batch(pair_rows(pairs, 24, PAD))
    shared = shared_rows(pairs, PAD)
    for two, one in zip(sequence_logps(model, rows), sequence_logps(model, shared)):
        np.testing.assert_allclose(np.asarray(one), np.asarray(two), rtol=1e-5, atol=1e-5)


def test_dpo_loss_and_gradients_equal_the_two_row_layout(tmp_path):
    """The whole DPO loss (frozen-copy reference) through both layouts of the same pairs."""
    cfg = load_config(DPOConfig, None, [f"run_dir={tmp_path}", "model.source=tiny"])
    model = Transformer(preset("tiny"), rngs=nnx.Rngs(0))
    tok = load_tokenizer("tiny")
    data = {flag: PreferenceData("builtin:arithmetic-pref", tok, max_length=cfg.data.max_length,
                                 max_records=8, shared_prompt=flag) for flag in (False, True)}
    loss_fn = make_dpo_loss(cfg, "copy")
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    # A reference other than the policy, so the DPO margins (and gradients) are not all zero.
    aux = flatten(jax.tree.map(lambda x: x * 0.97, params))

    def loss(p, batch):
        m = nnx.merge(graphdef, p, rest)
        return loss_fn(m, batch, 8.0, None, aux)

    results = {}
    for flag, d in data.items():
        batch = next(iter(d.batches(8)))
        (value, metrics), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, batch)
        results[flag] = (value, metrics, grads)
    (v0, m0, g0), (v1, m1, g1) = results[False], results[True]
    assert float(v0) > 0.0
    np.testing.assert_allclose(float(v1), float(v0), rtol=1e-5)
    # The summed metrics are differences of sequence log-probs (about -90 each here): hold
    # them to 1e-5 of what was summed, not of the small result.
    logps = jax.jit(lambda p, b: sequence_logps(nnx.merge(graphdef, p, rest), b)[0])
    scale = float(jnp.sum(jnp.abs(logps(params, next(iter(data[False].batches(8)))))))
    for key in m0:
        assert abs(float(m1[key]) - float(m0[key])) <= 1e-5 * max(scale, abs(float(m0[key]))), key
    # Gradients: 1e-5 of the largest gradient entry of the model. A gradient entry is a float32
    # sum over every token's contribution; where the contributions cancel, a leaf's own largest
    # entry can be far below what was summed (an AVX2 CPU measured 3.7e-7 against a leaf
    # maximum of 0.028, XLA summing in another order than on AVX-512).
    scale = max(float(jnp.max(jnp.abs(a))) for a in jax.tree.leaves(g0))
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        assert float(jnp.max(jnp.abs(a - b))) <= 1e-5 * scale


@pytest.mark.parametrize("name", list(_models()))
def test_rewards_equal_the_two_row_layout(name):
    """A reward model reads each answer's last token: in the shared row that token sees the
    prompt and its own answer only, so the reward is the one of the answer's own row."""
    from hone.models.reward import RewardModel
    cfg = _models()[name]
    model = RewardModel(Transformer(cfg, rngs=nnx.Rngs(4)), rngs=nnx.Rngs(5))
    pairs = _random_pairs(6, 1, cfg.vocab_size)
    rows = pair_batch(pair_rows(pairs, 24, PAD))
    two = np.asarray(model(rows["tokens"], positions=rows["positions"],
                           attention_mask=rows["attention_mask"], segment_ids=rows["segment_ids"]))
    shared = shared_rows(pairs, PAD)
    one = np.asarray(model.branch_rewards(*(shared[k] for k in (
        "tokens", "positions", "attention_mask", "segment_ids", "branch_ids"))))
    np.testing.assert_allclose(one, two.reshape(2, -1).T, rtol=1e-5, atol=1e-5)
