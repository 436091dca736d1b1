"""Records in: every place `data.path` may point to, read into a list of plain dicts.

Accepted paths (the first that applies wins):

- `builtin:NAME`: a bundled set from `hone.datasets.BUILTIN` (e.g. `builtin:arithmetic`).
- `FILE.jsonl`: one JSON object per line; blank lines are skipped. A line that is not JSON, or
  JSON that is not an object, is an `InputError` naming the file and the 1-based line number.
- `FILE.json`: one JSON list of objects.
- `FILE.parquet`: a Parquet table, read with pyarrow; one record per row.
- `FOLDER`: a folder written by Hugging Face `datasets`' `save_to_disk`:
  - a `Dataset` folder (`state.json` + `*.arrow`): its Arrow files are read in the order
    `state.json` lists them, with pyarrow's IPC stream reader (the format `datasets` writes),
    so the `datasets` package itself is not needed;
  - a `DatasetDict` folder (`dataset_dict.json` + one sub-folder per split): the `train` split,
    or any split by writing `FOLDER:SPLIT` (e.g. `data/my_set:test`).

`max_records` keeps the first N records (and stops reading there where the format allows it).
Anything else (unknown suffix, missing file, unreadable content) is an `InputError` naming the
path, so bad input stops at the edge instead of deep inside a training step. That includes JSON
that parses but is not text (a lone UTF-16 surrogate escape such as "\\ud800", which no tokenizer
can encode), Arrow values Python cannot hold (a date past year 9999), and a `datasets` folder
whose state.json names files outside the folder.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Iterator

from hone.errors import InputError

BUILTIN_PREFIX = "builtin:"


def read_records(path: str, max_records: int | None = None) -> list[dict]:
    """All records (plain dicts) at `path`, at most `max_records` of them."""
    path = str(path)
    if max_records is not None and max_records < 0:
        raise InputError(f"max_records must be >= 0, got {max_records}", path=path,
                         key="max_records")
    if path.startswith(BUILTIN_PREFIX):
        records = _builtin(path[len(BUILTIN_PREFIX):], path)
    else:
        records = _read_file_or_folder(path, max_records)
    return records if max_records is None else records[:max_records]


def _builtin(name: str, path: str) -> list[dict]:
    from hone.datasets import BUILTIN  # imported late: the sets are only built when asked for
    if name not in BUILTIN:
        raise InputError(f"no bundled dataset named {name!r}; bundled: "
                         + ", ".join(f"builtin:{n}" for n in BUILTIN), path=path)
    return BUILTIN[name]()


def _read_file_or_folder(path: str, max_records: int | None) -> list[dict]:
    file = Path(path)
    if file.is_dir():
        return _read_saved_dataset(file, None, path, max_records)
    folder, split = _split_suffix(path)
    if folder is not None:
        return _read_saved_dataset(folder, split, path, max_records)
    suffix = file.suffix.lower()
    if suffix not in _READERS:
        raise InputError("unknown data format: give a .jsonl, .json or .parquet file, a folder "
                         "saved by Hugging Face datasets (save_to_disk), or builtin:NAME", path=path)
    if not file.is_file():
        raise InputError("no such file", path=path)
    return _READERS[suffix](file, max_records)


def _split_suffix(path: str) -> tuple[Path | None, str | None]:
    """`FOLDER:SPLIT` -> (FOLDER, SPLIT) when FOLDER is a saved DatasetDict; else (None, None)."""
    head, sep, split = path.rpartition(":")
    if sep and head and split and "/" not in split and Path(head).is_dir():
        return Path(head), split
    return None, None


# ---- JSON Lines and JSON ------------------------------------------------------------------

def _iter_jsonl(file: Path) -> Iterator[dict]:
    path = str(file)
    try:
        handle = file.open("rb")
    except OSError as err:
        raise InputError(f"cannot open ({err.strerror})", path=path) from err
    # Binary lines split on b"\n" only (the JSON Lines separator), so line numbers are exact and
    # a decoding error is pinned to its own line rather than to a read-ahead chunk.
    with handle:
        for line_no, raw in enumerate(handle, start=1):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]  # a UTF-8 byte-order mark some editors write
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(f"line {line_no}: not UTF-8 text ({err.reason})",
                                 path=path) from err
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"line {line_no}: not valid JSON ({err.msg} at column "
                                 f"{err.colno})", path=path) from err
            except ValueError as err:  # e.g. an integer longer than Python's digit limit
                raise InputError(f"line {line_no}: not valid JSON ({err})", path=path) from err
            except RecursionError as err:  # absurdly deep nesting
                raise InputError(f"line {line_no}: JSON nested too deeply", path=path) from err
            if not isinstance(record, dict):
                raise InputError(f"line {line_no}: expected a JSON object ({{...}}), got "
                                 f"{_json_kind(record)}", path=path)
            if b"\\u" in raw and _SURROGATE_ESCAPE.search(line):
                _check_text(record, path, f"line {line_no}")
            yield record


def _read_jsonl(file: Path, max_records: int | None) -> list[dict]:
    out: list[dict] = []
    if max_records == 0:
        return out
    for record in _iter_jsonl(file):  # stops reading at max_records: later lines are not checked
        out.append(record)
        if max_records is not None and len(out) >= max_records:
            break
    return out


def _read_json(file: Path, max_records: int | None) -> list[dict]:
    path = str(file)
    try:
        text = file.read_text(encoding="utf-8")
        data = json.loads(text)
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError too
        raise InputError(f"not valid JSON ({err})", path=path) from err
    if not isinstance(data, list):
        raise InputError(f"expected a JSON list of objects, got {_json_kind(data)}; for one "
                         "object per line use a .jsonl file", path=path)
    check = _SURROGATE_ESCAPE.search(text) is not None
    for index, record in enumerate(data):
        if not isinstance(record, dict):
            raise InputError(f"record {index}: expected a JSON object, got {_json_kind(record)}",
                             path=path)
        if check:
            _check_text(record, path, f"record {index}")
    return data


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


# A \u escape of a UTF-16 surrogate. A pair of them is one character and fine; one alone parses
# into a str that cannot be encoded as UTF-8, so records are only walked when the text has one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def _check_text(record: dict, path: str, where: str) -> None:
    """InputError naming the field of `record` whose string (or key) holds a lone surrogate."""
    stack: list[tuple[Any, str]] = [(record, "")]
    while stack:
        value, field = stack.pop()
        place = None
        if isinstance(value, str) and not _encodable(value):
            place = repr(field)
        elif isinstance(value, dict):
            if not all(_encodable(k) for k in value):
                place = f"a key of {field!r}" if field else "a key"
            stack += [(v, f"{field}.{k}" if field else k) for k, v in value.items()]
        elif isinstance(value, list):
            stack += [(v, f"{field}[{i}]") for i, v in enumerate(value)]
        if place is not None:
            raise InputError(f"{where}: a lone UTF-16 surrogate escape (such as \\ud800) in "
                             f"{place} is not text; write the character itself or a full "
                             "surrogate pair", path=path)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


# ---- Arrow: Parquet and `datasets` folders --------------------------------------------------

def _pyarrow():
    try:
        import pyarrow
        import pyarrow.ipc  # noqa: F401  (submodules used below)
        import pyarrow.parquet  # noqa: F401
    except ImportError as err:  # pragma: no cover - pyarrow is a dependency
        raise InputError("reading Parquet files and datasets folders needs pyarrow "
                         "(pip install pyarrow)") from err
    return pyarrow


def _read_parquet(file: Path, max_records: int | None) -> list[dict]:
    pa = _pyarrow()
    try:
        parquet = pa.parquet.ParquetFile(str(file))
        records: list[dict] = []
        for batch in parquet.iter_batches():
            records.extend(_rows(batch, str(file), "row"))
            if max_records is not None and len(records) >= max_records:
                break
    except InputError:
        raise
    except (pa.ArrowException, OSError, ValueError) as err:  # ValueError: names not UTF-8
        raise InputError(f"not a readable Parquet file ({err})", path=str(file)) from err
    return records


def _rows(batch, path: str, what: str) -> list[dict]:
    """A record batch as dicts; a value Python cannot hold is an InputError, not a crash."""
    # Arrow trusts the offsets and lengths a file claims (an IPC stream is mapped, not parsed),
    # and converting a batch whose buffers lie reads out of bounds or allocates without limit.
    # Full validation checks every claim against the buffers first (ArrowInvalid otherwise).
    batch.validate(full=True)
    try:
        return batch.to_pylist()
    except (OverflowError, ValueError) as err:  # e.g. a date past datetime's year 9999
        if isinstance(err, _pyarrow().ArrowException):
            raise  # corrupt data: the caller's "not readable" message
        raise InputError(f"cannot turn a {what} into Python values ({err})", path=path) from err


def _read_saved_dataset(folder: Path, split: str | None, path: str,
                        max_records: int | None) -> list[dict]:
    if (folder / "dataset_dict.json").is_file():
        splits = _load_json_file(folder / "dataset_dict.json", path).get("splits", [])
        if not isinstance(splits, list) or not all(isinstance(s, str) for s in splits):
            raise InputError("dataset_dict.json has no 'splits' list of split names", path=path)
        split = split or "train"
        if split not in splits:
            raise InputError(f"this DatasetDict has no split {split!r} (splits: "
                             f"{', '.join(map(str, splits))}); pick one with FOLDER:SPLIT", path=path)
        folder = folder / split
    elif split is not None:
        raise InputError(f"FOLDER:SPLIT needs a DatasetDict folder (with dataset_dict.json); "
                         f"{folder} has none", path=path)
    state_file = folder / "state.json"
    if not state_file.is_file():
        raise InputError("a folder must be saved by Hugging Face datasets (save_to_disk): no "
                         "state.json or dataset_dict.json in it", path=path)
    files = _load_json_file(state_file, path).get("_data_files")
    if not isinstance(files, list) or not all(isinstance(f, dict) and "filename" in f for f in files):
        raise InputError("state.json has no '_data_files' list of {filename: ...}", path=path)
    for entry in files:  # `datasets` writes plain names of files in the folder, nothing else
        name = entry["filename"]
        if not (isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name
                and _encodable(name)):
            raise InputError(f"state.json lists the data file {name!r}; expected the name of a "
                             "file in this folder", path=path)
    pa = _pyarrow()
    records: list[dict] = []
    for entry in files:
        arrow_file = folder / entry["filename"]
        try:
            with pa.memory_map(str(arrow_file)) as source:
                for batch in pa.ipc.open_stream(source):
                    records.extend(_rows(batch, path, f"record of {entry['filename']}"))
                    if max_records is not None and len(records) >= max_records:
                        return records
        except InputError:
            raise
        except (pa.ArrowException, OSError, ValueError) as err:  # ValueError: names not UTF-8
            raise InputError(f"cannot read the Arrow file {entry['filename']} ({err})",
                             path=path) from err
    return records


def _load_json_file(file: Path, path: str) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"cannot read {file.name} ({err})", path=path) from err
    if not isinstance(data, dict):
        raise InputError(f"{file.name} is not a JSON object", path=path)
    return data


_READERS = {".jsonl": _read_jsonl, ".json": _read_json, ".parquet": _read_parquet}
