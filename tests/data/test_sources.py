"""read_records: every path kind, exact round trips, and errors that name file and line."""

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hone.data.sources import read_records
from hone.errors import InputError

RECORDS = [{"text": "one", "n": 1}, {"text": "two", "n": 2}, {"text": "three", "n": 3}]

json_scalars = st.none() | st.booleans() | st.integers(-10**12, 10**12) | st.text(max_size=20) \
    | st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
json_objects = st.dictionaries(st.text(max_size=10), json_values, max_size=5)
# `settings` shared by the file-writing property tests (tmp_path is reused across examples).
file_settings = settings(max_examples=60, deadline=None,
                         suppress_health_check=[HealthCheck.function_scoped_fixture])


def write_jsonl(path, lines):
    path.write_bytes(b"\n".join(line if isinstance(line, bytes) else line.encode() for line in lines)
                     + b"\n")


# ---- JSON Lines --------------------------------------------------------------------------

@file_settings
@given(records=st.lists(json_objects, max_size=8), blanks=st.lists(st.integers(0, 8), max_size=3))
def test_jsonl_round_trip(tmp_path, records, blanks):
    lines = [json.dumps(r, ensure_ascii=False) for r in records]
    for at in blanks:  # blank and whitespace-only lines are skipped
        lines.insert(min(at, len(lines)), "  ")
    file = tmp_path / "data.jsonl"
    write_jsonl(file, lines)
    assert read_records(str(file)) == records


def _is_corrupt(raw: bytes) -> bool:
    """Whether a line must be rejected: non-blank, and not UTF-8 JSON holding an object."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return True
    if not text.strip():
        return False
    try:
        return not isinstance(json.loads(text), dict)
    except ValueError:
        return True


corrupt_lines = (st.text(max_size=30).map(str.encode) | st.binary(max_size=30)
                 | json_values.map(lambda v: json.dumps(v).encode())  # valid JSON, not an object
                 | json_objects.map(lambda o: json.dumps(o)[:-1].encode())  # cut short
                 # (a leading byte-order mark is forgiven on line 1, so none is generated)
                 ).filter(lambda b: b"\n" not in b and not b.startswith(b"\xef\xbb\xbf")
                          and _is_corrupt(b))


@file_settings
@given(records=st.lists(json_objects, min_size=1, max_size=6), at=st.integers(0, 6),
       bad=corrupt_lines)
def test_jsonl_corrupt_line_names_its_number(tmp_path, records, at, bad):
    at = min(at, len(records))
    lines = [json.dumps(r) for r in records]
    lines.insert(at, bad)
    file = tmp_path / "data.jsonl"
    write_jsonl(file, lines)
    with pytest.raises(InputError) as err:
        read_records(str(file))
    message = str(err.value)
    assert str(file) in message
    assert int(re.search(r"line (\d+):", message).group(1)) == at + 1
    # max_records stops before the bad line: nothing after it is read.
    assert read_records(str(file), max_records=at) == records[:at]


def test_jsonl_non_object_and_bad_json_messages(tmp_path):
    file = tmp_path / "x.jsonl"
    write_jsonl(file, ['{"a": 1}', "", "[1, 2]"])
    with pytest.raises(InputError, match=r"line 3: expected a JSON object.*got a list"):
        read_records(str(file))
    write_jsonl(file, ['{"a": 1}', '{"a": '])
    with pytest.raises(InputError, match=r"x\.jsonl.*line 2: not valid JSON"):
        read_records(str(file))


def test_jsonl_crlf_and_bom(tmp_path):
    file = tmp_path / "win.jsonl"
    file.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n{"a": 2}\r\n')
    assert read_records(str(file)) == [{"a": 1}, {"a": 2}]


# ---- JSON, Parquet ---------------------------------------------------------------------------

def test_json_list(tmp_path):
    file = tmp_path / "data.json"
    file.write_text(json.dumps(RECORDS))
    assert read_records(str(file)) == RECORDS
    assert read_records(str(file), max_records=2) == RECORDS[:2]
    file.write_text(json.dumps({"text": "x"}))
    with pytest.raises(InputError, match="expected a JSON list"):
        read_records(str(file))
    file.write_text(json.dumps([{"a": 1}, 3]))
    with pytest.raises(InputError, match="record 1: expected a JSON object"):
        read_records(str(file))


def test_parquet(tmp_path):
    records = [{"prompt": f"p{i}", "completion": f"c{i}", "tags": [i, i + 1]} for i in range(50)]
    file = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(records), file, row_group_size=7)
    assert read_records(str(file)) == records
    assert read_records(str(file), max_records=10) == records[:10]
    (tmp_path / "bad.parquet").write_bytes(b"not parquet")
    with pytest.raises(InputError, match="bad.parquet"):
        read_records(str(tmp_path / "bad.parquet"))


# ---- folders saved by Hugging Face datasets --------------------------------------------------

def write_saved_dataset(folder, shards):
    """What `Dataset.save_to_disk` writes, by hand: Arrow IPC streams listed in state.json."""
    folder.mkdir(parents=True)
    names = []
    for k, shard in enumerate(shards):
        name = f"data-{k:05d}-of-{len(shards):05d}.arrow"
        table = pa.Table.from_pylist(shard)
        with pa.OSFile(str(folder / name), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table, max_chunksize=2)
        names.append(name)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": n} for n in names]}))


def test_saved_dataset_by_hand(tmp_path):
    write_saved_dataset(tmp_path / "ds", [RECORDS[:2], RECORDS[2:]])
    assert read_records(str(tmp_path / "ds")) == RECORDS
    assert read_records(str(tmp_path / "ds"), max_records=1) == RECORDS[:1]


def test_saved_dataset_with_datasets(tmp_path):
    datasets = pytest.importorskip("datasets")
    records = [{"messages": [{"role": "user", "content": f"q{i}"},
                             {"role": "assistant", "content": f"a{i}"}]} for i in range(30)]
    datasets.Dataset.from_list(records).save_to_disk(str(tmp_path / "one"), num_shards=3)
    assert read_records(str(tmp_path / "one")) == records
    test = [{"text": "held out"}]
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_list(RECORDS),
                                   "test": datasets.Dataset.from_list(test)})
    splits.save_to_disk(str(tmp_path / "dict"))
    assert read_records(str(tmp_path / "dict")) == RECORDS  # "train" by default
    assert read_records(str(tmp_path / "dict") + ":test") == test
    with pytest.raises(InputError, match="no split 'validation'"):
        read_records(str(tmp_path / "dict") + ":validation")


# ---- builtin and errors ------------------------------------------------------------------

def test_builtin():
    assert len(read_records("builtin:arithmetic")) == 2000
    assert len(read_records("builtin:arithmetic-rl", max_records=5)) == 5
    with pytest.raises(InputError, match="builtin:arithmetic-eval"):  # lists what exists
        read_records("builtin:nope")


def test_unknown_or_missing_paths(tmp_path):
    with pytest.raises(InputError, match=r"data\.csv.*unknown data format"):
        read_records(str(tmp_path / "data.csv"))
    with pytest.raises(InputError, match=r"missing\.jsonl.*no such file"):
        read_records(str(tmp_path / "missing.jsonl"))
    (tmp_path / "plain").mkdir()
    with pytest.raises(InputError, match=r"plain.*no state\.json"):
        read_records(str(tmp_path / "plain"))
    with pytest.raises(InputError, match="needs a DatasetDict"):
        read_records(str(tmp_path / "plain") + ":train")
