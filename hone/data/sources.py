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
path, so bad input stops at the edge instead of deep inside a training step.
"""

from __future__ import annotations

import json
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
        data = json.loads(file.read_text(encoding="utf-8"))
    except (ValueError, RecursionError) as err:  # JSONDecodeError and UnicodeDecodeError too
        raise InputError(f"not valid JSON ({err})", path=path) from err
    if not isinstance(data, list):
        raise InputError(f"expected a JSON list of objects, got {_json_kind(data)}; for one "
                         "object per line use a .jsonl file", path=path)
    for index, record in enumerate(data):
        if not isinstance(record, dict):
            raise InputError(f"record {index}: expected a JSON object, got {_json_kind(record)}",
                             path=path)
    return data


def _json_kind(value: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")


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
            records.extend(batch.to_pylist())
            if max_records is not None and len(records) >= max_records:
                break
    except (pa.ArrowException, OSError) as err:
        raise InputError(f"not a readable Parquet file ({err})", path=str(file)) from err
    return records


def _read_saved_dataset(folder: Path, split: str | None, path: str,
                        max_records: int | None) -> list[dict]:
    if (folder / "dataset_dict.json").is_file():
        splits = _load_json_file(folder / "dataset_dict.json", path).get("splits", [])
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
    pa = _pyarrow()
    records: list[dict] = []
    for entry in files:
        arrow_file = folder / entry["filename"]
        try:
            with pa.memory_map(str(arrow_file)) as source:
                for batch in pa.ipc.open_stream(source):
                    records.extend(batch.to_pylist())
                    if max_records is not None and len(records) >= max_records:
                        return records
        except (pa.ArrowException, OSError) as err:
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
