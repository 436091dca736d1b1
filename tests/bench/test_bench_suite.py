"""benchmarks/suite.py's summary (table, goal wording, chart) on fabricated driver results, and
_driver.write_section putting a new section at the top. No benchmark runs."""

from __future__ import annotations

import json
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))
import _driver  # noqa: E402
import suite  # noqa: E402


def rec(impl, row, median_s, **more):
    return {"impl": impl, "row": row, "median_s": median_s, "first_s": 10.0,
            "peak_rss_mb": 1000.0, "runs": 1, **more}


LAST = {
    "train": {"rounds": 2, "repeats": 3, "records": [
        rec("hone", "sft", 1.0), rec("tunix", "sft", 2.5), rec("torch", "sft", 2.0),
        rec("hone", "lora", 1.0), rec("tunix", "lora", 1.5),
        rec("hone", "sft-bf16", 0.5)]},  # compared with the others' fp32 sft
    "decode": {"rounds": 2, "repeats": 3, "records": [
        rec("hone", "decode-8", 2.0, batch=8, tokens_per_s=300.0),
        rec("tunix", "decode-8", 6.0, batch=8, tokens_per_s=100.0),
        rec("torch", "decode-8", 6.0, batch=8, tokens_per_s=100.0),
        rec("hone", "decode-32", 2.0, batch=32, tokens_per_s=100.0),
        rec("tunix", "decode-32", 2.0, batch=32, tokens_per_s=100.0)]},
    "dpo": {"rounds": 2, "repeats": 3, "records": [rec("hone", "dpo", 3.0)]},
    "grpo": {"rounds": 2, "repeats": 3, "records": [
        rec("hone", "grpo", 6.0), rec("hone-beta0", "grpo", 5.0), rec("tunix", "grpo", 6.6)]},
}


def by_row():
    return {r["row"]: r for r in suite.collect(LAST)}


def test_speedups_and_goal_wording():
    rows = by_row()
    assert list(rows) == ["sft", "lora", "dpo", "decode batch 8", "decode batch 32", "grpo",
                          "sft, hone bf16", "lora, hone bf16", "dpo, hone bf16",
                          "decode batch 8, hone bf16",
                          "decode batch 32, hone bf16"]
    assert rows["sft"]["speedup"] == {"tunix": 2.5, "torch": 2.0}
    assert suite.goal_cell(rows["sft"]["speedup"]) == "2x Tunix: met; 2.5x PyTorch: NOT met"
    assert rows["lora"]["speedup"] == {"tunix": 1.5, "torch": None}
    assert suite.goal_cell(rows["lora"]["speedup"]) == (
        "2x Tunix: NOT met; 2.5x PyTorch: not measured")
    # decode compares tokens per second: hone's over the other's
    assert rows["decode batch 8"]["speedup"] == {"tunix": 3.0, "torch": 3.0}
    assert suite.goal_cell(rows["decode batch 8"]["speedup"]) == "2x Tunix: met; 2.5x PyTorch: met"
    assert rows["decode batch 32"]["speedup"]["tunix"] == 1.0
    assert rows["dpo"]["speedup"] == {"tunix": None, "torch": None}
    assert set(rows["grpo"]["impls"]) == {"hone", "tunix"}  # hone-beta0 is not hone
    assert abs(rows["grpo"]["speedup"]["tunix"] - 1.1) < 1e-9
    assert rows["sft, hone bf16"]["speedup"] == {"tunix": 5.0, "torch": 4.0}
    assert rows["lora, hone bf16"]["speedup"] == {"tunix": None, "torch": None}


def test_table_and_section():
    rows = suite.collect(LAST)
    lines = suite.table(rows).splitlines()
    assert len(lines) == 2 + 11
    assert lines[2] == ("| sft | step s | 1.000 | 2.500 | 2.000 | 10.0 / 10.0 / 10.0 | "
                        "1000 / 1000 / 1000 | 2.50x | 2.00x | "
                        "2x Tunix: met; 2.5x PyTorch: NOT met |")
    assert lines[5].startswith("| decode batch 8 | tok/s | 300.0 | 100.0 | 100.0 |")
    assert lines[4].startswith("| dpo | step s | 3.000 | - | - | 10.0 / - / - |")
    text = suite.section(rows, LAST, "benchmarks/suite.py --quick")
    assert text.startswith("## Summary\n")
    assert "(results.png)" in text
    # met: sft vs Tunix, decode 8 vs both, sft bf16 vs both; not: sft vs PyTorch, lora,
    # decode 32, grpo (1.1x)
    assert "5 of 9 measured comparisons met" in text


def test_chart_is_a_png(tmp_path):
    path = suite.chart(suite.collect(LAST), tmp_path / "results.png")
    data = path.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_write_section_puts_a_new_section_first_and_replaces_it(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Title\n\nintro\n\n## Decode\n\nold decode\n")
    _driver.write_section("Summary", "## Summary\n\none", path, top=True)
    assert path.read_text() == "# Title\n\nintro\n\n## Summary\n\none\n\n## Decode\n\nold decode\n"
    _driver.write_section("Summary", "## Summary\n\ntwo", path, top=True)
    assert path.read_text() == "# Title\n\nintro\n\n## Summary\n\ntwo\n\n## Decode\n\nold decode\n"


def test_save_last_round_trips(tmp_path):
    class Args:
        rounds, repeats = 1, 2
    path = _driver.save_last("train", Args, [rec("hone", "sft", 1.0)], tmp_path / "t.json")
    saved = json.loads(path.read_text())
    assert (saved["driver"], saved["rounds"], saved["repeats"]) == ("train", 1, 2)
    assert suite.collect({"train": saved})[0]["impls"]["hone"]["median_s"] == 1.0


def test_main_runs_every_driver_in_order_and_writes_the_summary(tmp_path, monkeypatch):
    ran = []

    def fake_run(name, flags):
        ran.append((name, flags))
        return LAST[name]

    results = tmp_path / "RESULTS.md"
    results.write_text("# Benchmark results\n\n## Decode\n\nold\n")
    monkeypatch.setattr(suite, "run_driver", fake_run)
    monkeypatch.setattr(suite, "CHART", tmp_path / "results.png")
    monkeypatch.setattr(_driver, "RESULTS", results)
    monkeypatch.setattr(sys, "argv", ["suite.py", "--quick"])
    suite.main()
    flags = ["--rounds", "1", "--repeats", "1"]
    assert ran == [(d, flags) for d in ("decode", "train", "dpo", "grpo")]
    text = results.read_text()
    assert text.index("## Summary") < text.index("## Decode")
    assert "`benchmarks/suite.py --rounds 1 --repeats 1`" in text
    assert (tmp_path / "results.png").stat().st_size > 1000
