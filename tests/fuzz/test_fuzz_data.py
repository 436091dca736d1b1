"""Hostile data: every file kind `read_records` accepts, and records of every shape the SFT,
preference and RL prompt readers meet, either read or raise InputError naming the file.

Files: JSON Lines and JSON (broken syntax, non-UTF-8 bytes, byte-order marks, 5,000-digit
numbers, nesting 100,000 deep, NaN, lone UTF-16 surrogates such as "\\ud800" that decode to a
string no tokenizer can encode), Parquet and Arrow streams (valid tables of awkward column types,
then cut or overwritten), folders saved by `datasets` whose state.json or dataset_dict.json lie
(file names that are numbers, absolute paths or `..`, splits that are not a list).
Records: fields missing or of the wrong type at every level (`messages` a string, a message a
number, `role` a list, `content` null), special-token text, surrogates, under every format and
option of the three readers.
"""

from __future__ import annotations

import datetime
import decimal
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import tokenizers
from hypothesis import given
from hypothesis import strategies as st

import hone
from fuzz_common import EXAMPLES, FUZZ, HOSTILE_INTS, Scratch, anywhere, clear_or_ok, mostly
from hone.data.loader import SFTData
from hone.data.preference import PreferenceData
from hone.data.sources import read_records
from hone.rl.prompts import PromptData

SCRATCH = Scratch("data")
TINY = hone.load_tokenizer("tiny")  # byte-level, ChatML template
PLAIN = hone.Tokenizer(tokenizers.Tokenizer.from_str(TINY.backend.to_str()), bos_token="<bos>",
                       eos_token="<eos>", pad_token="<pad>", chat_template=None,
                       source="plain-tokenizer")
SPECIALS = ["<|im_start|>", "<|im_end|>", "<eos>", "<pad>", "{{ x }}", "{% raw %}", "\x00",
            "\ufeff", "\r\n", "assistant\n"]

# ---- values -------------------------------------------------------------------------------------

# Text with the occasional special token or lone surrogate (json.dumps writes \udXXX).
texts = mostly(st.text(max_size=12),
               st.sampled_from(SPECIALS)
               | st.text(st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), min_size=1,
                         max_size=2).map(lambda s: "x" + s))
scalars = (st.none() | st.booleans() | st.sampled_from(HOSTILE_INTS) | st.integers()
           | st.floats() | texts)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(texts, inner, max_size=3), max_leaves=6)

# ---- files --------------------------------------------------------------------------------------

def _jsonl_line(draw) -> bytes:
    kind = draw(st.sampled_from(["object", "object", "value", "bytes", "special"]))
    if kind == "object":
        return json.dumps(draw(st.dictionaries(texts, json_values, max_size=4))).encode()
    if kind == "value":
        return json.dumps(draw(json_values)).encode()
    if kind == "bytes":
        return draw(st.binary(max_size=24)).replace(b"\n", b" ")
    return draw(st.sampled_from([
        b"", b"   ", b"\xef\xbb\xbf{}", b'{"a": NaN, "b": -Infinity}', b'{"a": 1e999}',
        b'{"a": ' + b"9" * 5000 + b"}", b"[" * 100_000, b'{"a":' * 50_000, b'{"a": "\\ud800"}',
        b'{"\\udfff": 1}', b'{"a": 1} trailing', b'{"a": 1, "a": 2}', b"\xff\xfe{}", b"\x00"]))


@st.composite
def jsonl_files(draw) -> bytes:
    lines = [_jsonl_line(draw) for _ in range(draw(st.integers(0, 5)))]
    return b"\n".join(lines) + draw(st.sampled_from([b"\n", b"", b"\r\n"]))


@st.composite
def json_files(draw) -> bytes:
    if draw(st.booleans()):
        return json.dumps(draw(st.lists(json_values, max_size=4) | json_values)).encode()
    return draw(st.sampled_from([b"", b"[", b"[{}, ", b"\xff[]", b"[" * 100_000,
                                 b"[" + b"9" * 5000 + b"]", b'[{"a": "\\udc00"}]', b"[NaN]"])
                | st.binary(max_size=32))


def _tables() -> list[pa.Table]:
    """Valid tables of awkward column types: values Python cannot hold (dates, durations past
    datetime's range), bytes, decimals, maps, nulls, nested lists, no columns at all."""
    return [
        pa.table({"prompt": ["q1", "q2"], "completion": ["a1", "a2"]}),
        pa.table({"messages": [[{"role": "user", "content": "hi"}], []]}),
        pa.table({"d": pa.array([2**31 - 1], pa.date32())}),
        pa.table({"t": pa.array([2**62], pa.duration("s"))}),
        pa.table({"t": pa.array([2**62], pa.timestamp("ns"))}),
        pa.table({"t": pa.array([-2**62], pa.timestamp("us"))}),
        pa.table({"x": pa.array([b"\xff"], pa.binary()), "y": pa.array([None], pa.null())}),
        pa.table({"x": pa.array([decimal.Decimal("1.5")], pa.decimal128(5, 2))}),
        pa.table({"m": pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64()))}),
        pa.table({"t": pa.array([datetime.time(1, 2)], pa.time64("us"))}),
        pa.table({"text": pa.array(["a", "b"]).dictionary_encode()}),
        pa.Table.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]),
        pa.table({}),
    ]


def _parquet(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()


def _arrow_stream(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue()


TABLES = _tables()
# Plus one whose column name is made invalid UTF-8 in place (no writer would produce it).
_BAD_NAME = pa.table({"zzzz": ["a"]})
PARQUET = [_parquet(t) for t in TABLES] + [_parquet(_BAD_NAME).replace(b"zzzz", b"\x80zzz")]
ARROW = [_arrow_stream(t) for t in TABLES] + [
    _arrow_stream(_BAD_NAME).replace(b"zzzz", b"\x80zzz")]


@st.composite
def damaged(draw, valid: list[bytes]) -> bytes:
    """One of `valid`, maybe overwritten in a few places and maybe cut short."""
    data = bytearray(draw(st.sampled_from(valid)))
    if draw(st.integers(0, 2)) == 2:
        for _ in range(draw(st.integers(1, 4))):
            at = draw(anywhere) % len(data)
            chunk = draw(st.binary(min_size=1, max_size=8))
            data[at:at + len(chunk)] = chunk
    if draw(st.integers(0, 2)) == 2:
        data = data[:draw(anywhere) % (len(data) + 1)]
    return bytes(data)


filenames = (st.just("data.arrow")
             | st.sampled_from(["missing.arrow", "/dev/null", "/", "..", ".", "../data.arrow",
                                "state.json", ""]) | json_values)


@st.composite
def hostile_paths(draw) -> tuple[str, str]:
    """(path to read, name its errors must mention), after writing the files."""
    kind = draw(st.sampled_from(["jsonl", "json", "parquet", "dataset", "dataset_dict"]))
    if kind == "jsonl":
        return str(SCRATCH.write("hostile.jsonl", draw(jsonl_files()))), "hostile.jsonl"
    if kind == "json":
        return str(SCRATCH.write("hostile.json", draw(json_files()))), "hostile.json"
    if kind == "parquet":
        return str(SCRATCH.write("hostile.parquet", draw(damaged(PARQUET)))), "hostile.parquet"
    # A `datasets` folder: always the same files, overwritten (removing folders is slow).
    top = SCRATCH.folder(f"hostile-{kind}")
    folder = top / "train" if kind == "dataset_dict" else top
    folder.mkdir(exist_ok=True)
    (folder / "data.arrow").write_bytes(draw(damaged(ARROW)))
    files = [{"filename": name} for name in draw(st.lists(filenames, min_size=1, max_size=2))]
    state = draw(st.sampled_from([{"_data_files": files}, {"_data_files": files}])
                 | st.fixed_dictionaries({"_data_files": json_values}) | json_values)
    (folder / "state.json").write_text(json.dumps(state))
    path = str(top)
    if kind == "dataset_dict":
        splits = draw(st.sampled_from([["train"], ["train", "test"], "train", "t"]) | json_values)
        (top / "dataset_dict.json").write_text(json.dumps({"splits": splits}))
        path += draw(st.sampled_from(["", ":train", ":test", ":"]))
    return path, top.name


# ---- records ------------------------------------------------------------------------------------

roles = mostly(st.sampled_from(["user", "assistant", "system"]),
               st.sampled_from(["tool", "", "USER"]) | scalars)
messages = mostly(st.fixed_dictionaries({"role": roles, "content": mostly(texts, json_values)}),
                  st.fixed_dictionaries({}, optional={"role": roles, "content": json_values,
                                                      "name": texts}) | scalars)
conversations = mostly(st.lists(messages, min_size=1, max_size=4), scalars | st.just([]))
replies = mostly(texts, conversations | scalars)
records = mostly(
    st.fixed_dictionaries({"messages": conversations}) | st.fixed_dictionaries(
        {"prompt": mostly(texts, conversations), "completion": replies})
    | st.fixed_dictionaries({"text": replies})
    | st.fixed_dictionaries({"prompt": mostly(texts, conversations), "chosen": replies,
                             "rejected": replies}, optional={"answer": scalars}),
    st.fixed_dictionaries({}, optional={
        "messages": conversations, "prompt": replies, "completion": replies, "text": replies,
        "chosen": replies, "rejected": replies, "answer": scalars}) | json_values)


def _reader(draw):
    """A reader of a records file with random (valid) options: SFT, preference or RL prompts."""
    kind = draw(st.sampled_from(["sft", "preference", "prompts"]))
    max_length = draw(st.sampled_from([2, 3, 8, 64]))
    common = dict(overlong=draw(st.sampled_from(["truncate", "drop"])),
                  max_records=draw(st.sampled_from([None, None, 1, 2])))
    tokenizer = draw(st.sampled_from([TINY, PLAIN]))
    if kind == "sft":
        options = dict(format=draw(st.sampled_from(["auto", "messages", "prompt_completion",
                                                    "text"])),
                       loss_on=draw(st.sampled_from(["completion", "all"])),
                       pack=draw(st.booleans()))
        return lambda path: SFTData(path, tokenizer, max_length=max_length, **options, **common)
    if kind == "preference":
        return lambda path: PreferenceData(path, tokenizer, max_length=max_length, **common)
    chat = draw(st.booleans())
    return lambda path: PromptData(path, TINY if chat else tokenizer, max_prompt_tokens=max_length,
                                   chat=chat, **common)


@st.composite
def hostile_record_files(draw):
    lines = [json.dumps(r).encode() for r in draw(st.lists(records, min_size=1, max_size=4))]
    path = str(SCRATCH.write("records.jsonl", b"\n".join(lines)))
    return path, _reader(draw)


# ---- properties ---------------------------------------------------------------------------------

def _read(path: str) -> None:
    result = read_records(path)
    assert isinstance(result, list) and all(isinstance(r, dict) for r in result)


@FUZZ
@given(case=hostile_paths())
def test_hostile_data_files(case):
    assert EXAMPLES >= 2000
    path, name = case
    clear_or_ok(lambda: _read(path), name)


@FUZZ
@given(case=hostile_record_files())
def test_hostile_records(case):
    path, read = case
    # A chat record for a tokenizer without a template is the tokenizer's fault: named instead.
    clear_or_ok(lambda: read(path), ("records.jsonl", "plain-tokenizer"))
