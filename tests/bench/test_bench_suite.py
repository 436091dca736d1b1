"""benchmarks/suite.py's summary (table, dates, goal wording, not-run reasons, chart) on
fabricated driver figures, _figures.py's dated store (newest figures win, superseded runs go),
and _driver.write_section putting a new section at the top. No benchmark runs, no JAX."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _driver  # noqa: E402
import _figures  # noqa: E402
import suite  # noqa: E402


def rec(impl, row, median_s, **more):
    return {"impl": impl, "row": row, "median_s": median_s, "first_s": 10.0,
            "peak_rss_mb": 1000.0, "runs": 1, **more}


def run(driver, date, records, rounds=2, repeats=3):
    """One saved run of a driver, as its --write adds it to figures/DRIVER.json."""
    return {"date": date, "command": f"benchmarks/{driver}.py --rounds {rounds} --repeats "
            f"{repeats}", "rounds": rounds, "repeats": repeats, "records": records}


FIGURES = {
    "train": [run("train", "2026-11-30", [
        rec("hone", "sft", 1.0), rec("tunix", "sft", 2.5), rec("torch", "sft", 2.0),
        rec("hone", "lora", 1.0), rec("tunix", "lora", 1.5),
        rec("hone", "sft-bf16", 0.5)])],  # compared with the others' fp32 sft
    "decode": [run("decode", "2026-12-01", [
        rec("hone", "decode-8", 2.0, batch=8, tokens_per_s=300.0),
        rec("tunix", "decode-8", 6.0, batch=8, tokens_per_s=100.0),
        rec("torch", "decode-8", 6.0, batch=8, tokens_per_s=100.0),
        rec("hone", "decode-32", 2.0, batch=32, tokens_per_s=100.0),
        rec("tunix", "decode-32", 2.0, batch=32, tokens_per_s=100.0)])],
    "dpo": [run("dpo", "2026-11-29", [rec("hone", "dpo", 3.0)])],
    "grpo": [run("grpo", "2026-11-30", [
        rec("hone", "grpo", 6.0), rec("hone-beta0", "grpo", 5.0), rec("tunix", "grpo", 6.6)])],
    "rollouts": [run("rollouts", "2026-12-06", [  # hone's row is the paged engine's
        rec("hone", "long-tail", 100.0, tokens_per_s=600.0),
        rec("hone", "long-tail-static", 300.0, tokens_per_s=200.0),
        rec("tunix", "long-tail", 400.0, tokens_per_s=150.0)], rounds=1, repeats=1)],
}


def by_row():
    return {r["row"]: r for r in suite.collect(FIGURES)}


def test_speedups_and_goal_wording():
    rows = by_row()
    assert list(rows) == ["sft", "lora", "sft 1 x 2048", "dpo", "decode batch 8", "decode batch 32", "grpo",
                          "rollout long-tail", "rollout uniform", "sft, hone bf16", "lora, hone bf16", "dpo, hone bf16",
                          "decode batch 8, hone bf16",
                          "decode batch 32, hone bf16"]
    assert rows["sft"]["speedup"] == {"tunix": 2.5, "torch": 2.0}
    assert suite.goal_cell(rows["sft"]) == "2x Tunix: met; 2.5x PyTorch: NOT met"
    assert rows["lora"]["speedup"] == {"tunix": 1.5, "torch": None}
    assert suite.goal_cell(rows["lora"]) == (
        "2x Tunix: NOT met; 2.5x PyTorch: not run (train.py's saved runs have no torch lora)")
    # decode compares tokens per second: hone's over the other's
    assert rows["decode batch 8"]["speedup"] == {"tunix": 3.0, "torch": 3.0}
    assert suite.goal_cell(rows["decode batch 8"]) == "2x Tunix: met; 2.5x PyTorch: met"
    assert rows["decode batch 32"]["speedup"]["tunix"] == 1.0
    assert rows["dpo"]["speedup"] == {"tunix": None, "torch": None}
    assert set(rows["grpo"]["impls"]) == {"hone", "tunix"}  # hone-beta0 is not hone
    assert abs(rows["grpo"]["speedup"]["tunix"] - 1.1) < 1e-9
    assert rows["grpo"]["missing"] == {"torch": "PyTorch has no GRPO driver"}
    assert rows["sft, hone bf16"]["speedup"] == {"tunix": 5.0, "torch": 4.0}
    assert rows["lora, hone bf16"]["speedup"] == {"tunix": None, "torch": None}
    assert rows["rollout long-tail"]["speedup"] == {"tunix": 4.0, "torch": None}
    assert rows["rollout long-tail"]["missing"] == {"torch": "PyTorch has no rollout driver"}
    assert rows["rollout uniform"]["speedup"] == {"tunix": None, "torch": None}


def test_table_and_section():
    rows = suite.collect(FIGURES)
    lines = suite.table(rows).splitlines()
    assert len(lines) == 2 + 14  # sft 1 x 2048 (not run here) is row 3
    assert lines[2] == ("| sft | 2026-11-30 | step s | 1.000 | 2.500 | 2.000 | "
                        "10.0 / 10.0 / 10.0 | 1000 / 1000 / 1000 | 2.50x | 2.00x | "
                        "2x Tunix: met; 2.5x PyTorch: NOT met |")
    assert lines[6].startswith("| decode batch 8 | 2026-12-01 | tok/s | 300.0 | 100.0 | 100.0 |")
    assert lines[4].startswith("| sft 1 x 2048 | not run | step s | not run |")
    assert lines[5].startswith("| dpo | 2026-11-29 | step s | 3.000 | not run | not run | "
                               "10.0 / - / - |")
    assert lines[8] == ("| grpo | 2026-11-30 | step s | 6.000 | 6.600 | not run | "
                        "10.0 / 10.0 / - | 1000 / 1000 / - | 1.10x | - | "
                        "2x Tunix: NOT met; 2.5x PyTorch: not run (PyTorch has no GRPO driver) |")
    text = suite.section(rows, "benchmarks/suite.py --quick")
    assert text.startswith("## Summary\n")
    assert ("`benchmarks/decode.py --rounds 2 --repeats 3` (2026-12-01); "
            "`benchmarks/train.py --rounds 2 --repeats 3` (2026-11-30)") in text
    assert "(results.png)" in text
    assert lines[9].startswith("| rollout long-tail | 2026-12-06 | tok/s | 600.0 | 150.0 | "
                               "not run |")
    # met: sft vs Tunix, decode 8 vs both, sft bf16 vs both, rollout long-tail vs Tunix; not:
    # sft vs PyTorch, lora, decode 32, grpo (1.1x)
    assert "6 of 10 measured comparisons met" in text


def test_rows_keep_their_own_dates_newest_wins_and_missing_says_why():
    """decode from 2026-12-01, train from 2026-11-30 and again 2026-12-02 for hone sft only
    (so sft's hone figure is the newest and Tunix's stays from its own run), grpo twice with
    the older run last in the file, dpo never saved."""
    figures = {
        "decode": [run("decode", "2026-12-01", [
            rec("hone", "decode-8", 2.0, tokens_per_s=400.0),
            rec("tunix", "decode-8", 4.0, tokens_per_s=200.0),
            # tok/s to one decimal, as recovered from a table: the ratio comes from the medians
            rec("hone", "decode-32", 3.076, tokens_per_s=166.5),
            rec("tunix", "decode-32", 6.778, tokens_per_s=75.5)])],
        "train": [run("train", "2026-11-30", [rec("hone", "sft", 2.0), rec("tunix", "sft", 4.0),
                                              rec("hone", "lora", 1.0)]),
                  run("train", "2026-12-02", [rec("hone", "sft", 1.0)]),
                  # train.py --batch 1 --seq-len 2048: its own rows, never replacing sft's
                  run("train", "2026-12-03", [rec("hone", "sft 1x2048", 6.0),
                                              rec("torch", "sft 1x2048", 9.0)])],
        "grpo": [run("grpo", "2026-12-01", [rec("hone", "grpo", 3.0), rec("tunix", "grpo", 9.0)]),
                 run("grpo", "2026-11-28", [rec("hone", "grpo", 30.0),
                                            rec("tunix", "grpo", 1.0)])],
    }
    rows = {r["row"]: r for r in suite.collect(figures)}
    assert len(rows) == len(suite.ROWS)  # every row survives, measured or not
    assert suite.date_cell(rows["decode batch 8"]["impls"]) == "2026-12-01"
    assert suite.date_cell(rows["lora"]["impls"]) == "2026-11-30"
    assert rows["sft 1 x 2048"]["speedup"]["torch"] == pytest.approx(1.5)
    assert suite.date_cell(rows["sft 1 x 2048"]["impls"]) == "2026-12-03"
    # the newest hone sft (1.0 s, 2026-12-02) against Tunix's only one (4.0 s, 2026-11-30)
    assert rows["sft"]["impls"]["hone"]["median_s"] == 1.0
    assert rows["sft"]["speedup"]["tunix"] == 4.0
    assert suite.date_cell(rows["sft"]["impls"]) == "2026-12-02 (hone); 2026-11-30 (tunix)"
    # newest by date, not by place in the file
    assert rows["grpo"]["speedup"]["tunix"] == 3.0
    assert suite.date_cell(rows["grpo"]["impls"]) == "2026-12-01"
    assert rows["decode batch 8"]["speedup"]["tunix"] == 2.0
    for label in ("dpo", "dpo, hone bf16"):
        assert rows[label]["impls"] == {}
        assert suite.date_cell(rows[label]["impls"]) == "not run"
        assert suite.goal_cell(rows[label]) == (
            "2x Tunix: not run (no figures from dpo.py --write yet); "
            "2.5x PyTorch: not run (no figures from dpo.py --write yet)")
    assert rows["sft, hone bf16"]["missing"]["hone"] == (
        "train.py's saved runs have no hone sft-bf16")
    lines = {line.split(" | ")[0][2:]: line for line in
             suite.table(list(rows.values())).splitlines()[2:]}
    assert len(lines) == len(suite.ROWS)
    assert lines["dpo"].startswith("| dpo | not run | step s | not run | not run | not run |")
    assert " | 166.5 | 75.5 | not run | " in lines["decode batch 32"]
    assert " | 2.20x | - | " in lines["decode batch 32"]  # 6.778 / 3.076; 166.5 / 75.5 = 2.205
    assert lines["sft"].startswith("| sft | 2026-12-02 (hone); 2026-11-30 (tunix) | step s | "
                                   "1.000 | 4.000 | not run |")
    text = suite.section(list(rows.values()), "benchmarks/suite.py --summary-only")
    assert ("`benchmarks/train.py --rounds 2 --repeats 3` (2026-12-02); "
            "`benchmarks/train.py --rounds 2 --repeats 3` (2026-11-30)") in text
    assert "2026-11-28" not in text  # that grpo run supplies nothing


def test_figures_store_keeps_older_runs_only_while_they_supply_a_record(tmp_path):
    first = run("train", "2026-11-30", [rec("hone", "sft", 2.0), rec("tunix", "sft", 4.0)])
    _figures.add_run("train", first, tmp_path)
    hone_only = run("train", "2026-12-01", [rec("hone", "sft", 1.0)])
    _figures.add_run("train", hone_only, tmp_path)
    assert _figures.load(["train", "dpo"], tmp_path) == {"train": [first, hone_only]}
    newest = _figures.newest(_figures.load_runs(tmp_path / "train.json"))
    assert (newest["hone", "sft"]["median_s"], newest["hone", "sft"]["date"]) == (1.0, "2026-12-01")
    assert (newest["tunix", "sft"]["median_s"], newest["tunix", "sft"]["date"]) == (
        4.0, "2026-11-30")
    both = run("train", "2026-12-01", [rec("hone", "sft", 0.5), rec("tunix", "sft", 3.0)])
    _figures.add_run("train", both, tmp_path)  # same day, later: replaces both older runs
    saved = json.loads((tmp_path / "train.json").read_text())
    assert saved == {"driver": "train", "runs": [both]}


def test_report_with_write_saves_the_section_and_its_dated_figures(tmp_path, monkeypatch):
    class Args:
        rounds, repeats, write, title = 1, 2, True, "Training steps"
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n")
    monkeypatch.setattr(_driver, "RESULTS", results)
    monkeypatch.setattr(_figures, "FIGURES", tmp_path / "figures")
    _driver.report(Args, "## Training steps\n\ntable", "train.py", [rec("hone", "sft", 1.0)],
                   " --bf16")
    assert "## Training steps\n\ntable" in results.read_text()
    (saved,) = _figures.load(["train"])["train"]
    assert saved["date"] == _figures.today()
    assert saved["command"] == "benchmarks/train.py --rounds 1 --repeats 2 --bf16"
    assert suite.collect({"train": [saved]})[0]["impls"]["hone"]["median_s"] == 1.0


def test_chart_is_a_png(tmp_path):
    path = suite.chart(suite.collect(FIGURES), tmp_path / "results.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_write_section_puts_a_new_section_first_and_replaces_it(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Title\n\nintro\n\n## Decode\n\nold decode\n")
    _driver.write_section("Summary", "## Summary\n\none", path, top=True)
    assert path.read_text() == "# Title\n\nintro\n\n## Summary\n\none\n\n## Decode\n\nold decode\n"
    _driver.write_section("Summary", "## Summary\n\ntwo", path, top=True)
    assert path.read_text() == "# Title\n\nintro\n\n## Summary\n\ntwo\n\n## Decode\n\nold decode\n"


def _point_at(tmp_path, monkeypatch, argv) -> Path:
    """suite.main's outputs and the figures folder under tmp_path; returns RESULTS.md."""
    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Decode\n\nold\n")
    monkeypatch.setattr(suite, "CHART", tmp_path / "results.png")
    monkeypatch.setattr(_driver, "RESULTS", results)
    monkeypatch.setattr(_figures, "FIGURES", tmp_path / "figures")
    monkeypatch.setattr(sys, "argv", argv)
    return results


def test_main_runs_every_driver_in_order_and_writes_the_summary(tmp_path, monkeypatch):
    ran = []

    def fake_run(name, flags, own=None):  # what the driver's --write does to the figures
        ran.append((name, flags, own))
        _figures.add_run(name, FIGURES[name][0], tmp_path / "figures")

    results = _point_at(tmp_path, monkeypatch, ["suite.py", "--quick"])
    monkeypatch.setattr(suite, "run_driver", fake_run)
    suite.main()
    flags = ["--rounds", "1", "--repeats", "1"]
    assert ran == [("decode", flags, None), ("train", flags, None),
                   ("train", flags, ["--rows", "sft", "--batch", "1", "--seq-len", "2048"]),
                   ("dpo", flags, None), ("grpo", flags, None), ("rollouts", flags, None)]
    text = results.read_text()
    assert text.index("## Summary") < text.index("## Decode")
    assert "`benchmarks/suite.py --rounds 1 --repeats 1`" in text
    assert "| dpo | 2026-11-29 | step s | 3.000 |" in text
    assert (tmp_path / "results.png").stat().st_size > 1000


def test_summary_only_runs_nothing_and_keeps_every_saved_driver(tmp_path, monkeypatch):
    results = _point_at(tmp_path, monkeypatch, ["suite.py", "--summary-only"])
    monkeypatch.setattr(suite, "run_driver", lambda *a: pytest.fail("ran a driver"))
    for name in ("decode", "train"):
        _figures.add_run(name, FIGURES[name][0], tmp_path / "figures")
    suite.main()
    text = results.read_text()
    assert "| sft | 2026-11-30 | step s | 1.000 |" in text
    assert "| decode batch 8 | 2026-12-01 | tok/s | 300.0 |" in text
    assert "| grpo | not run |" in text and "no figures from grpo.py --write yet" in text
    assert text.endswith("## Decode\n\nold\n")
