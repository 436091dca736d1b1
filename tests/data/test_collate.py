"""pad_rows / pack_rows: layout invariants (property tests) and packed == alone on the tiny model."""

from collections import Counter

import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import hone
from hone.data.collate import KEYS, pack_rows, pad_rows
from hone.data.sft import Example

PAD = 256


def make_example(tokens, mask) -> Example:
    mask = np.asarray(mask, np.bool_)
    mask[0] = False
    return Example(np.asarray(tokens, np.int32), mask)


@st.composite
def documents(draw):
    length = draw(st.integers(2, 24))
    sizes = draw(st.lists(st.integers(1, length), min_size=1, max_size=12))
    examples = [make_example(draw(st.lists(st.integers(0, 255), min_size=n, max_size=n)),
                             draw(st.lists(st.booleans(), min_size=n, max_size=n)))
                for n in sizes]
    return length, examples


def split_documents(rows):
    """Each row's documents as (tokens, targets, loss_mask) tuples, checking row-level invariants."""
    docs = []
    for r in range(len(rows["tokens"])):
        seg = rows["segment_ids"][r]
        assert np.array_equal(rows["attention_mask"][r], (seg > 0).astype(np.int32))
        assert not rows["loss_mask"][r][seg == 0].any()  # no loss on padding
        assert (rows["tokens"][r][seg == 0] == PAD).all()
        ids = [s for s in dict.fromkeys(seg.tolist()) if s > 0]
        assert ids == list(range(1, len(ids) + 1))  # numbered 1.. in row order
        for s in ids:
            where = np.flatnonzero(seg == s)
            assert np.array_equal(where, np.arange(where[0], where[-1] + 1))  # contiguous
            assert np.array_equal(rows["positions"][r][where], np.arange(len(where)))  # restart
            docs.append((rows["tokens"][r][where], rows["targets"][r][where],
                         rows["loss_mask"][r][where]))
    return docs


def check(rows, examples, length):
    for key in KEYS:
        assert rows[key].shape == (len(rows["tokens"]), length)
    assert rows["loss_mask"].dtype == np.float32
    assert all(rows[k].dtype == np.int32 for k in KEYS if k != "loss_mask")
    docs = split_documents(rows)
    # Every document exactly once, with its shifted targets and mask.
    assert Counter(tuple(t.tolist()) for t, _, _ in docs) == \
        Counter(tuple(e.tokens.tolist()) for e in examples)
    for tokens, targets, mask in docs:
        assert np.array_equal(targets[:-1], tokens[1:]) and targets[-1] == PAD
        assert mask[-1] == 0
    expected = Counter((tuple(e.tokens.tolist()), tuple(e.loss_mask[1:].tolist()))
                       for e in examples)
    assert Counter((tuple(t.tolist()), tuple(m[:-1].astype(bool).tolist()))
                   for t, _, m in docs) == expected


@settings(max_examples=150, deadline=None)
@given(documents())
def test_pad_rows_invariants(case):
    length, examples = case
    rows = pad_rows(examples, length, PAD)
    assert len(rows["tokens"]) == len(examples)
    check(rows, examples, length)
    for r, example in enumerate(examples):  # in order, one per row, left-aligned
        assert np.array_equal(rows["tokens"][r, :len(example)], example.tokens)


@settings(max_examples=150, deadline=None)
@given(documents())
def test_pack_rows_invariants(case):
    length, examples = case
    rows = pack_rows(examples, length, PAD)
    check(rows, examples, length)
    total = sum(len(e) for e in examples)
    assert -(-total // length) <= len(rows["tokens"]) <= len(examples)
    assert (rows["attention_mask"].sum(axis=1) > 0).all()  # no empty rows


def test_pack_rows_first_fit_in_order():
    sizes = [6, 5, 2, 3, 1]
    examples = [make_example([k] * n, [True] * n) for k, n in enumerate(sizes)]
    rows = pack_rows(examples, 8, PAD)
    # 6 -> row 0 (2 left); 5 -> row 1 (3 left); 2 -> row 0 (full); 3 -> row 1 (full); 1 -> row 2.
    assert rows["tokens"].tolist() == [
        [0, 0, 0, 0, 0, 0, 2, 2],
        [1, 1, 1, 1, 1, 3, 3, 3],
        [4, PAD, PAD, PAD, PAD, PAD, PAD, PAD]]
    assert rows["segment_ids"].tolist() == [
        [1, 1, 1, 1, 1, 1, 2, 2], [1, 1, 1, 1, 1, 2, 2, 2], [1, 0, 0, 0, 0, 0, 0, 0]]
    assert rows["positions"][1].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert rows["loss_mask"][0].tolist() == [1, 1, 1, 1, 1, 0, 1, 0]


def test_too_long_document_is_a_bug():
    with pytest.raises(ValueError, match="does not fit"):
        pack_rows([make_example([1] * 5, [True] * 5)], 4, PAD)


def test_packed_logits_equal_each_document_alone():
    model = hone.load_model("tiny")
    rng = np.random.default_rng(0)
    sizes = [7, 12, 5, 9, 3, 16]
    examples = [make_example(rng.integers(0, 256, n), [True] * n) for n in sizes]
    packed = pack_rows(examples, 24, PAD)
    n_packed = len(packed["tokens"])
    assert n_packed < len(examples)  # something was actually packed
    # Each document alone: one per row, right-padded (causal attention never looks right).
    alone = pad_rows(examples, 24, PAD)
    # One forward pass over both layouts, so the tiny model compiles once.
    both = {k: jnp.asarray(np.concatenate([packed[k], alone[k]])) for k in packed}
    logits = np.asarray(model(both["tokens"], positions=both["positions"],
                              attention_mask=both["attention_mask"],
                              segment_ids=both["segment_ids"]))
    seen = 0
    for r in range(n_packed):
        seg = packed["segment_ids"][r]
        for s in range(1, seg.max() + 1):
            where = np.flatnonzero(seg == s)
            k = next(k for k, e in enumerate(examples) if np.array_equal(
                e.tokens, packed["tokens"][r][where]))
            reference = logits[n_packed + k, :len(where)]
            assert np.abs(logits[r, where] - reference).max() <= 1e-5
            seen += 1
    assert seen == len(examples)
    # And the padded row is the document run with no padding at all.
    single = np.asarray(model(jnp.asarray(examples[0].tokens)[None]))[0]
    assert np.abs(logits[n_packed, :sizes[0]] - single).max() <= 1e-5
