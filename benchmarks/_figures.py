"""The drivers' figures, kept in git: benchmarks/figures/DRIVER.json, one file per driver.

Why a tracked file: the Summary section of RESULTS.md is built from every driver's figures, but
the drivers run one at a time (an hour in all) and often alone. It used to read
benchmarks/.last/DRIVER.json, which was git-ignored and held only this machine's latest run of
each driver, so rerunning one driver blanked every other row. A file in git keeps each driver's
figures, with their date, until a newer run replaces them, on any machine; parsing the section
tables back out of RESULTS.md would tie the summary to the wording of four tables instead.

Layout of figures/DRIVER.json (written by the driver's --write, beside its RESULTS.md section):

    {"driver": "train",
     "runs": [{"date": "2026-11-30", "command": "benchmarks/train.py --rounds 1 ...",
               "rounds": 1, "repeats": 3,
               "records": [{"impl": "hone", "row": "sft", "median_s": ..., ...}, ...]},
              ...]}

A record is one (impl, row)'s medians over the run's rounds. A run may measure only some
(impl, row) pairs (`--impls hone`, no `--bf16`), so older runs stay as long as they supply a
record no newer run has; `newest` takes, per (impl, row), the record of the newest run (by date,
then by order in the file, so two runs of one day keep the later).
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
FIGURES = HERE / "figures"


def today() -> str:
    return datetime.date.today().isoformat()


def _key(record: dict) -> tuple[str, str]:
    return record["impl"], record["row"]


def _replaced_key(record: dict) -> tuple:
    """What a newer record replaces in a driver's file: the same implementation, row and
    (where the driver records it) remat setting."""
    return (*_key(record), record.get("remat"))


def add_run(name: str, run: dict, folder: Path | None = None) -> Path:
    """Append `run` ({"date", "command", "rounds", "repeats", "records"}) to folder/NAME.json
    and drop the older runs every record of which a newer run has replaced."""
    path = (folder or FIGURES) / f"{name}.json"
    runs = load_runs(path) + [run]
    kept, seen = [], set()
    for r in reversed(ordered(runs)):  # newest first: a run stays if it still supplies a record
        keys = {_replaced_key(rec) for rec in r["records"]}
        if keys - seen:
            kept.append(r)
        seen |= keys
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"driver": name, "runs": kept[::-1]}, indent=1) + "\n")
    return path


def load_runs(path: Path) -> list[dict]:
    """The runs saved in one driver's file ([] when it does not exist)."""
    return json.loads(path.read_text())["runs"] if path.exists() else []


def load(names, folder: Path | None = None) -> dict[str, list[dict]]:
    """{driver: its saved runs} for each of `names` that has a file in `folder`."""
    folder = folder or FIGURES
    return {n: load_runs(folder / f"{n}.json") for n in names
            if (folder / f"{n}.json").exists()}


def ordered(runs: list[dict]) -> list[dict]:
    """Oldest first: by date, ties kept in file order (the later one is the newer)."""
    return sorted(runs, key=lambda r: r["date"])  # sorted is stable


def newest(runs: list[dict]) -> dict[tuple[str, str], dict]:
    """{(impl, row): the newest run's record, with "date", "command", "rounds", "repeats" of
    that run added}."""
    out = {}
    for run in ordered(runs):
        for rec in run["records"]:
            out[_key(rec)] = {**rec, **{k: run[k] for k in ("date", "command", "rounds",
                                                              "repeats")}}
    return out
