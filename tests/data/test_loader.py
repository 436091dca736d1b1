"""SFTData: rows from a path, exact resume of the shuffled iterator, and masked eval batches."""

import json

import numpy as np
import pytest

import hone
from hone.data.collate import KEYS
from hone.data.loader import SFTData, TrainIterator
from hone.errors import InputError

TINY = hone.load_tokenizer("tiny")


def small_data(n=10, **kw) -> SFTData:
    records = [{"prompt": f"q{i}:", "completion": f"a{i}" * (1 + i % 3)} for i in range(n)]
    return SFTData("<test>", TINY, max_length=16, records=records, **kw)


def same(a, b) -> bool:
    return all(np.array_equal(x[k], y[k]) for x, y in zip(a, b) for k in KEYS) and len(a) == len(b)


def row_ids(batch) -> list[str]:
    """Rows identified by their text (every small_data row is different)."""
    return [TINY.decode(t[m > 0].tolist()) for t, m in zip(batch["tokens"], batch["attention_mask"])]


def test_batches_have_static_shapes_and_dtypes():
    data = SFTData("builtin:arithmetic", TINY, max_length=192, max_records=40, batch_size=4)
    batch = data.iterator().next()
    assert set(batch) == set(KEYS)
    for key in KEYS:
        assert batch[key].shape == (4, 192)
        assert batch[key].dtype == (np.float32 if key == "loss_mask" else np.int32)
    assert data.stats.kept == 40 and data.format == "messages"
    assert "kept 40" in data.describe()


@pytest.mark.parametrize("pack", [False, True])
def test_resume_continues_exactly(pack):
    data = small_data(n=10, pack=pack, batch_size=3)
    it = data.iterator(seed=5)
    for _ in range(7):  # 21 rows: across at least one epoch boundary
        it.next()
    state = json.loads(json.dumps(it.get_state()))  # JSON-safe, as a checkpoint stores it
    expected = [it.next() for _ in range(5)]
    fresh = data.iterator(seed=5)
    fresh.set_state(state)
    assert same([fresh.next() for _ in range(5)], expected)


def test_resume_at_an_epoch_boundary():
    data = small_data(n=12, batch_size=4)  # 3 batches per epoch
    it = data.iterator()
    for _ in range(3):
        it.next()
    state = it.get_state()
    expected = [it.next() for _ in range(5)]
    fresh = data.iterator()
    fresh.set_state(state)
    assert same([fresh.next() for _ in range(5)], expected)


def test_each_epoch_is_a_permutation_and_reshuffled():
    data = small_data(n=12, batch_size=4)
    it = data.iterator(seed=1)
    epochs = [[r for _ in range(3) for r in row_ids(it.next())] for _ in range(3)]
    everything = sorted(row_ids({k: data.rows[k] for k in KEYS}))
    assert all(sorted(epoch) == everything for epoch in epochs)
    assert epochs[0] != epochs[1] or epochs[1] != epochs[2]
    other = data.iterator(seed=2)
    assert [r for _ in range(3) for r in row_ids(other.next())] != epochs[0]


def test_state_from_other_data_is_refused():
    state = small_data(n=10, batch_size=3).iterator().get_state()
    with pytest.raises(InputError, match="cannot resume exactly"):
        small_data(n=11, batch_size=3).iterator().set_state(state)
    with pytest.raises(InputError, match="cannot resume exactly"):
        small_data(n=10, batch_size=2).iterator().set_state(state)


def test_state_names_no_key_so_a_renamed_key_resumes():
    """The RL prompt iterator's rows were {"tokens": indices} and are {"index": indices}: a
    state saved under the old name resumes the new iterator exactly (it holds no key name)."""
    old = TrainIterator({"tokens": np.arange(10)[:, None]}, 3, 7)
    old.next(), old.next()
    state = old.get_state()
    new = TrainIterator({"index": np.arange(10)[:, None]}, 3, 7)
    new.set_state(state)
    assert new.next()["index"].tolist() == old.next()["tokens"].tolist()


def test_eval_batches_cover_rows_once_with_masked_padding():
    data = small_data(n=10, batch_size=4)
    batches = list(data.batches())
    assert len(batches) == data.num_batches() == 3
    assert all(b["tokens"].shape == (4, 16) for b in batches)
    last = batches[-1]
    assert not last["loss_mask"][2:].any() and not last["attention_mask"][2:].any()
    for key in KEYS:  # rows in order, unshuffled
        assert np.array_equal(np.concatenate([b[key] for b in batches])[:10], data.rows[key])
    assert sum(b["loss_mask"].sum() for b in batches) == data.num_target_tokens
    assert len(list(data.batches(max_batches=2))) == 2


def test_stats_and_policies_through_the_loader():
    records = [{"prompt": "p", "completion": "ok"}, {"prompt": "p", "completion": ""},
               {"prompt": "p" * 30, "completion": "c"}, {"prompt": "pp", "completion": "c" * 30}]
    data = SFTData("<test>", TINY, max_length=16, records=records)
    assert data.stats.as_dict() == {"kept": 2, "skipped_empty": 1, "dropped_overlong": 1,
                                    "truncated": 1}
    assert data.num_rows == 2


def test_jsonl_file_end_to_end(tmp_path):
    file = tmp_path / "train.jsonl"
    file.write_text("\n".join(json.dumps({"text": f"doc {i}"}) for i in range(9)))
    data = SFTData(str(file), TINY, max_length=32, pack=True, batch_size=2)
    assert data.format == "text" and data.num_rows == 2  # 9 docs of 6 tokens, 5 per row
    assert data.iterator().next()["segment_ids"].max() >= 2


def test_errors_name_the_path(tmp_path):
    with pytest.raises(InputError, match="holds no records"):
        SFTData("<empty>", TINY, records=[])
    with pytest.raises(InputError, match=r"<test>.*no record is left.*skipped_empty 1"):
        SFTData("<test>", TINY, records=[{"text": " "}])
    with pytest.raises(InputError, match=r"<test>: 'completion': record 1"):
        SFTData("<test>", TINY, records=[{"prompt": "a", "completion": "b"}, {"prompt": "a"}])
    with pytest.raises(InputError, match="data.loss_on"):
        SFTData("builtin:arithmetic", TINY, loss_on="prompt")
    with pytest.raises(InputError, match="train.batch_size"):
        SFTData("builtin:arithmetic", TINY, max_records=4, batch_size=0)
