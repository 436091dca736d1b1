"""`hone doctor`: the report names this backend's devices, kernels and attention path, and flags
installed versions that differ from a lock. In-process, no compilation: well under a second."""

from __future__ import annotations

import json

import jax

from hone.cli import main
from hone.doctor import read_lock


def doctor_json(capsys, *args) -> dict:
    assert main(["doctor", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_report_describes_this_cpu_backend(capsys):
    r = doctor_json(capsys)
    assert r["backend"] == jax.default_backend() == "cpu"
    assert [d["id"] for d in r["devices"]] == [d.id for d in jax.devices()]
    assert {d["platform"] for d in r["devices"]} == {"cpu"}
    assert r["host_memory"]["total"] > 0
    # 256-token blocks: a row that fits one block is dense; longer rows on a CPU go blockwise.
    assert r["attention"] == {"block": 256, "short_rows": "dense", "long_rows": "blockwise"}
    assert isinstance(r["kernels"]["cpu_decode_kernels"], bool) and r["kernels"]["why"]
    assert r["paged_attention"].startswith(
        "hone's CPU decode kernel" if r["kernels"]["cpu_decode_kernels"] else "XLA gathers")
    # The suite's environment is the locked set (tests/test_install.py holds it there).
    v = r["versions"]
    assert v["lock"].endswith("requirements/lock.txt")
    assert v["mismatched"] == {} and v["missing"] == [] and v["matched"] > 50


def test_the_kernels_are_reported_off_when_turned_off(capsys, monkeypatch):
    monkeypatch.setenv("HONE_CPU_KERNELS", "0")
    r = doctor_json(capsys)
    assert r["kernels"] == {"cpu_decode_kernels": False, "why": "HONE_CPU_KERNELS=0"}
    assert r["paged_attention"].startswith("XLA gathers")  # the rollout engine's path follows


def test_versions_that_differ_from_the_lock_are_flagged(capsys, tmp_path):
    lock = tmp_path / "lock.txt"
    lock.write_text("# a comment\njax==0.0.1  # too old\nnot-a-real-package-xyz==1.0\n\n"
                    f"jaxlib=={jax.__version__}\n")
    assert read_lock(lock) == {"jax": "0.0.1", "not-a-real-package-xyz": "1.0",
                               "jaxlib": jax.__version__}
    v = doctor_json(capsys, "--lock", str(lock))["versions"]
    assert v["mismatched"] == {"jax": {"installed": jax.__version__, "locked": "0.0.1"}}
    assert v["missing"] == ["not-a-real-package-xyz"] and v["matched"] == 1
    assert main(["doctor", "--lock", str(lock)]) == 0
    text = capsys.readouterr().out
    assert f"DIFFERENT jax: installed {jax.__version__}, locked 0.0.1" in text
    assert "1 as locked, 1 different, 1 not installed" in text
    assert "backend cpu" in text and "model.attention=auto: dense" in text


def test_without_a_lock_the_report_says_so(capsys, tmp_path):
    r = doctor_json(capsys, "--lock", str(tmp_path / "absent.txt"))
    assert r["versions"]["lock"] is None and r["versions"]["matched"] == 0
    assert main(["doctor", "--lock", str(tmp_path / "absent.txt")]) == 0
    assert "no lock file found" in capsys.readouterr().out
