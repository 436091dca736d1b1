"""Preference pairs: formats, completion masks, skip/truncate policies, errors, [2B, L] batches,
exact resume and per-pair arrays that travel with their pair."""

import json
import re

import numpy as np
import pytest
import tokenizers
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import processors

import hone
from hone.data.collate import KEYS
from hone.data.preference import PairStats, PreferenceData, pair_batch, pair_rows, tokenize_pair
from hone.datasets import BUILTIN
from hone.errors import InputError

TINY = hone.load_tokenizer("tiny")
END = "<|im_end|>"


def variant(template=None, bos=False):
    """The tiny byte-level vocabulary with another chat template, optionally adding BOS."""
    backend = tokenizers.Tokenizer.from_str(TINY.backend.to_str())
    if bos:
        backend.post_processor = processors.TemplateProcessing(
            single="<bos> $A", special_tokens=[("<bos>", TINY.bos_id)])
    return hone.Tokenizer(backend, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
                          chat_template=template)


RAW = variant()  # no chat template: raw prompt + completion + EOS
RAW_BOS = variant(bos=True)


def record(prompt="q:", chosen="good", rejected="bad"):
    return {"prompt": prompt, "chosen": chosen, "rejected": rejected}


def small_data(n=10, **kw) -> PreferenceData:
    records = [record(f"q{i}:", f"yes{i}", f"no{i}" * (1 + i % 3)) for i in range(n)]
    return PreferenceData("<test>", TINY, max_length=48, records=records, **kw)


def completion_text(batch, row) -> str:
    """Decoded targets under the loss mask of one row."""
    return TINY.decode(batch["targets"][row][batch["loss_mask"][row] > 0].tolist())


def prompt_len(batch, row) -> int:
    """Tokens before the first completion token (the first target is predicted from the last)."""
    return int(np.argmax(batch["loss_mask"][row] > 0)) + 1


def row_pair(data, batch, row) -> int:
    """Which stored pair a chosen row is (matched by its tokens)."""
    hits = np.flatnonzero((data.pairs["tokens"][:, 0] == batch["tokens"][row]).all(axis=1))
    assert len(hits) == 1
    return int(hits[0])


# ---- builtin sets, layout and masks -----------------------------------------------------------

@pytest.mark.parametrize("name", ["arithmetic-pref", "arithmetic-pref-eval"])
def test_builtin_sets_load_with_chat_masks(name):
    records = BUILTIN[name]()[:64]
    data = PreferenceData(f"builtin:{name}", TINY, max_length=192, max_records=64, batch_size=4)
    assert data.format == "text" and data.num_pairs == 64
    assert data.stats.as_dict() == {"kept": 64, "skipped_empty": 0, "dropped_overlong": 0,
                                    "truncated": 0, "skipped_identical": 0}
    assert "kept 64" in data.describe()
    batches = list(data.batches())
    assert len(batches) == 16
    for k, batch in enumerate(batches):
        assert set(batch) == set(KEYS) | {"pair_valid"}
        for key in KEYS:
            assert batch[key].shape == (8, 192)
            assert batch[key].dtype == (np.float32 if key == "loss_mask" else np.int32)
        assert batch["pair_valid"].dtype == np.float32 and batch["pair_valid"].tolist() == [1] * 4
        for i in range(4):
            rec = records[4 * k + i]
            assert completion_text(batch, i) == rec["chosen"] + END
            assert completion_text(batch, 4 + i) == rec["rejected"] + END
            # Both rows hold the same prompt: the user turn and the generation prompt.
            p = prompt_len(batch, i)
            assert p == prompt_len(batch, 4 + i)
            assert np.array_equal(batch["tokens"][i, :p], batch["tokens"][4 + i, :p])
            user = [{"role": "user", "content": rec["prompt"]}]
            assert TINY.decode(batch["tokens"][i, :p]) == TINY.apply_chat_template(user)
            n = p + len(TINY.encode(rec["chosen"])) + 1
            assert batch["attention_mask"][i].tolist() == [1] * n + [0] * (192 - n)
            assert batch["positions"][i, :n].tolist() == list(range(n))
            assert np.array_equal(batch["segment_ids"][i], batch["attention_mask"][i])
            assert batch["loss_mask"][i].sum() == n - p  # completion tokens only


def test_without_chat_template_raw_prompt_completion_eos():
    pair = tokenize_pair(record("2+2=", "4", "5"), RAW)
    assert pair.prompt.tolist() == RAW.encode("2+2=")
    assert pair.chosen.tolist() == RAW.encode("4") + [RAW.eos_id]
    assert pair.rejected.tolist() == RAW.encode("5") + [RAW.eos_id]
    assert pair.prompt.dtype == pair.chosen.dtype == np.int32


def test_conversational_format():
    user = [{"role": "user", "content": "Hi"}]
    as_text = tokenize_pair(record("Hi", "Yo", "No"), TINY)
    for chosen in ("Yo", [{"role": "assistant", "content": "Yo"}]):
        pair = tokenize_pair({"prompt": user, "chosen": chosen,
                              "rejected": [{"role": "assistant", "content": "No"}]}, TINY)
        for side in ("prompt", "chosen", "rejected"):
            assert getattr(pair, side).tolist() == getattr(as_text, side).tolist()
    # A multi-turn prompt: earlier assistant turns are prompt, only the reply is completion.
    turns = [{"role": "system", "content": "Be brief."}, *user,
             {"role": "assistant", "content": "Hello"}, {"role": "user", "content": "More?"}]
    pair = tokenize_pair({"prompt": turns, "chosen": "Yes", "rejected": "No"}, TINY)
    assert TINY.decode(pair.prompt) == TINY.apply_chat_template(turns)
    assert TINY.decode(pair.chosen) == "Yes" + END and TINY.decode(pair.rejected) == "No" + END


# ---- policies --------------------------------------------------------------------------------

def test_identical_and_empty_pairs_are_skipped_and_counted():
    records = [record(), record(chosen="same", rejected="same"), record(chosen=" \n"),
               record(rejected=""), record(rejected=[{"role": "assistant", "content": " "}]) | {
                   "prompt": [{"role": "user", "content": "q"}]}]
    data = PreferenceData("<test>", TINY, records=records[:4])
    assert data.stats.as_dict() == {"kept": 1, "skipped_empty": 2, "dropped_overlong": 0,
                                    "truncated": 0, "skipped_identical": 1}
    assert data.num_pairs == 1
    stats = PairStats()
    assert tokenize_pair(records[4], TINY, stats=stats) is None and stats.skipped_empty == 1
    with pytest.raises(InputError, match=r"<test>: no pair is left.*skipped_identical 1"):
        PreferenceData("<test>", TINY, records=records[1:2])


def test_truncate_keeps_bos_and_prompt_end_then_cuts_completions():
    full = tokenize_pair(record("abcdefghij", "xy", "z"), RAW_BOS)
    assert full.prompt.tolist() == [RAW_BOS.bos_id, *b"abcdefghij"]
    stats = PairStats()
    pair = tokenize_pair(record("abcdefghij", "xy", "z"), RAW_BOS, max_length=8, stats=stats)
    # Completions (3 and 2 tokens) fit whole; the prompt keeps BOS and its last 4 tokens.
    assert pair.prompt.tolist() == [RAW_BOS.bos_id, *b"ghij"]
    assert pair.chosen.tolist() == full.chosen.tolist()
    assert pair.rejected.tolist() == full.rejected.tolist()
    # Long completions: the prompt keeps max_length // 2, the completions the rest.
    pair = tokenize_pair(record("abcdefghij", "x" * 10, "yyy"), RAW_BOS, max_length=8,
                         stats=stats)
    assert pair.prompt.tolist() == [RAW_BOS.bos_id, *b"hij"]
    assert pair.chosen.tolist() == [*b"xxxx"]
    assert pair.rejected.tolist() == [*b"yyy", RAW_BOS.eos_id]
    assert stats.as_dict() == {"kept": 2, "skipped_empty": 0, "dropped_overlong": 0,
                               "truncated": 2, "skipped_identical": 0}


def test_overlong_drop_and_identical_after_truncation():
    stats = PairStats()
    rec = record("p" * 6, "c" * 6, "r" * 3)
    assert tokenize_pair(rec, RAW, max_length=12, overlong="drop", stats=stats) is None
    assert len(tokenize_pair(rec, RAW, max_length=13, overlong="drop", stats=stats)) == 13
    # Truncation leaves both completions equal: no preference left, dropped.
    assert tokenize_pair(record("p" * 6, "same-a", "same-b"), RAW, max_length=8,
                         stats=stats) is None
    assert stats.as_dict() == {"kept": 1, "skipped_empty": 0, "dropped_overlong": 2,
                               "truncated": 0, "skipped_identical": 0}


# ---- errors ----------------------------------------------------------------------------------

@pytest.mark.parametrize("rec, field, words", [
    ({"prompt": "p", "chosen": "c"}, "rejected", "missing field"),
    ({"chosen": "c", "rejected": "r"}, "prompt", "missing field"),
    (record(prompt=3), "prompt", "must be a string"),
    (record(chosen=None), "chosen", "got null"),
    (record(rejected=["r"]), "rejected", "must be a string"),
    ({"prompt": [{"role": "user", "content": "q"}], "chosen": "c",
      "rejected": [{"role": "user", "content": "r"}]}, "rejected", "one assistant message"),
    ({"prompt": [{"role": "user"}], "chosen": "c", "rejected": "r"}, "prompt[0].content",
     "missing field"),
])
def test_bad_records_name_file_record_and_field(rec, field, words):
    with pytest.raises(InputError) as err:
        tokenize_pair(rec, TINY, path="data/pref.jsonl", index=7)
    assert str(err.value).startswith(f"data/pref.jsonl: '{field}': record 7: ")
    assert words in str(err.value)


def test_errors_through_a_file_and_bad_templates(tmp_path):
    file = tmp_path / "pref.jsonl"
    file.write_text(json.dumps(record()) + "\n" + json.dumps({"prompt": "p", "chosen": "c"}))
    with pytest.raises(InputError, match=rf"^{re.escape(str(file))}: 'rejected': record 1: "):
        PreferenceData(str(file), TINY)
    with pytest.raises(InputError, match=r"'prompt': record 0: missing field.*'messages'"):
        PreferenceData("builtin:arithmetic", TINY, max_records=2)
    conversational = {"prompt": [{"role": "user", "content": "q"}], "chosen": "a", "rejected": "b"}
    with pytest.raises(InputError, match="'prompt': record 0: .*needs a tokenizer with a chat"):
        tokenize_pair(conversational, RAW)
    # A template whose prompt text depends on the reply cannot share one prompt.
    odd = variant("{% for m in messages %}{{ m['role'] }}: {% if m['role'] == 'assistant' and "
                  "m['content'] | length > 3 %}LONG {% endif %}{{ m['content'] }}\n{% endfor %}"
                  "{% if add_generation_prompt %}assistant: {% endif %}")
    with pytest.raises(InputError, match="'prompt': record 0: .*renders this prompt differently"):
        tokenize_pair(record("Hi", "Yo", "Hello"), odd)
    with pytest.raises(InputError, match="data.overlong"):
        PreferenceData("<test>", TINY, records=[record()], overlong="cut")


# ---- iterator, eval batches, per-pair arrays --------------------------------------------------

def test_training_batches_keep_pairs_together_and_resume_exactly():
    data = small_data(n=10, batch_size=3)
    it = data.iterator(seed=5)
    for _ in range(7):  # 21 pairs: across at least one epoch boundary
        batch = it.next()
        assert batch["tokens"].shape == (6, 48) and batch["pair_valid"].tolist() == [1] * 3
        for i in range(3):
            k = row_pair(data, batch, i)
            assert np.array_equal(batch["tokens"][3 + i], data.pairs["tokens"][k, 1])
            assert completion_text(batch, i) == f"yes{k}{END}"
    state = json.loads(json.dumps(it.get_state()))  # JSON-safe, as a checkpoint stores it
    expected = [it.next() for _ in range(5)]
    fresh = data.iterator(seed=5)
    fresh.set_state(state)
    for got, want in zip([fresh.next() for _ in range(5)], expected):
        assert set(got) == set(want)
        assert all(np.array_equal(got[key], want[key]) for key in want)
    with pytest.raises(InputError, match="cannot resume exactly"):
        small_data(n=11, batch_size=3).iterator(seed=5).set_state(state)


def test_eval_batches_in_order_with_padding_pairs():
    data = small_data(n=10, batch_size=4)
    batches = list(data.batches())
    assert len(batches) == data.num_batches() == 3
    assert batches[-1]["pair_valid"].tolist() == [1, 1, 0, 0]
    last = batches[-1]
    for row in (2, 3, 6, 7):  # the padding pairs' chosen and rejected rows
        assert not last["loss_mask"][row].any() and not last["attention_mask"][row].any()
    for side in (0, 1):
        rows = np.concatenate([b["tokens"][4 * side:4 * side + 4] for b in batches])[:10]
        assert np.array_equal(rows, data.pairs["tokens"][:, side])
    assert sum(b["loss_mask"].sum() for b in batches) == data.num_target_tokens
    assert len(list(data.batches(max_batches=2))) == 2


def test_extra_per_pair_arrays_travel_with_their_pair():
    data = small_data(n=10, batch_size=4)
    index = np.arange(10, dtype=np.float32)
    data.add_pair_arrays(ref_chosen_logp=index, ref_rejected_logp=-index)
    it = data.iterator(seed=3)
    for _ in range(5):
        batch = it.next()
        assert batch["ref_chosen_logp"].shape == (4,)
        assert batch["ref_chosen_logp"].dtype == np.float32
        for i in range(4):
            k = row_pair(data, batch, i)
            assert batch["ref_chosen_logp"][i] == k and batch["ref_rejected_logp"][i] == -k
    last = list(data.batches())[-1]
    assert last["ref_chosen_logp"].tolist() == [8, 9, 0, 0]
    with pytest.raises(ValueError, match="leading axis of 10"):
        data.add_pair_arrays(bad=np.zeros(9))
    with pytest.raises(ValueError, match="built-in"):
        data.add_pair_arrays(pair_valid=np.zeros(10))


# ---- property test ---------------------------------------------------------------------------

texts = st.text(max_size=24).filter(lambda s: "<|" not in s)  # no special-token spellings


@settings(max_examples=150, deadline=None)
@given(prompt=texts, chosen=texts, rejected=texts, max_length=st.integers(2, 64),
       overlong=st.sampled_from(["truncate", "drop"]),
       tok=st.sampled_from([TINY, RAW, RAW_BOS]))
def test_pair_invariants(prompt, chosen, rejected, max_length, overlong, tok):
    rec = record(prompt, chosen, rejected)
    whole = tokenize_pair(rec, tok, max_length=100_000)
    stats = PairStats()
    pair = tokenize_pair(rec, tok, max_length=max_length, overlong=overlong, stats=stats)
    counts = stats.as_dict()
    assert sum(counts.values()) - counts["truncated"] == 1  # one record, one outcome
    if not chosen.strip() or not rejected.strip():
        assert pair is None and counts["skipped_empty"] == 1
        return
    if whole is None:  # identical completions, or an empty raw prompt without BOS
        assert pair is None
        if chosen == rejected:
            assert counts["skipped_identical"] == 1
        else:
            assert counts["skipped_empty"] == 1 and tok is RAW and prompt == ""
        return
    end = END if tok is TINY else "<eos>"
    assert tok.decode(whole.chosen) == chosen + end and tok.decode(whole.rejected) == rejected + end
    if len(whole) <= max_length:
        assert counts["kept"] == 1 and counts["truncated"] == 0
        assert all(np.array_equal(getattr(pair, s), getattr(whole, s))
                   for s in ("prompt", "chosen", "rejected"))
    elif pair is None:
        assert counts["dropped_overlong"] == 1
        assert overlong == "drop" or np.array_equal(*_cut_completions(whole, max_length))
        return
    else:
        assert overlong == "truncate" and counts["truncated"] == 1
        head = int(whole.prompt[0] == tok.bos_id)
        assert pair.prompt[:head].tolist() == whole.prompt[:head].tolist()
        tail = pair.prompt[head:].tolist()
        assert tail == (whole.prompt[len(whole.prompt) - len(tail):].tolist() if tail else [])
        assert len(pair.prompt) >= min(len(whole.prompt), max_length // 2)
        assert whole.chosen[:len(pair.chosen)].tolist() == pair.chosen.tolist()
        assert whole.rejected[:len(pair.rejected)].tolist() == pair.rejected.tolist()
    assert 1 <= len(pair.prompt) and 1 <= len(pair.chosen) and 1 <= len(pair.rejected)
    assert len(pair) <= max_length and pair.chosen.tolist() != pair.rejected.tolist()
    # Collated: the masks cover exactly each completion, after the shared prompt.
    batch = pair_batch(pair_rows([pair], max_length, tok.pad_id))
    p = len(pair.prompt)
    for row, side in enumerate((pair.chosen, pair.rejected)):
        assert np.array_equal(batch["targets"][row][batch["loss_mask"][row] > 0], side)
        assert np.array_equal(batch["tokens"][row, :p], pair.prompt)
        assert batch["attention_mask"][row].sum() == p + len(side)


def _cut_completions(whole, max_length):
    """The completions as truncation would cut them (for the identical-after-cut check)."""
    keep = min(len(whole.prompt), max(max_length - max(len(whole.chosen), len(whole.rejected)),
                                      max_length // 2))
    room = max_length - keep
    return whole.chosen[:room], whole.rejected[:room]
