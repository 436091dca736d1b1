"""Pieces shared by the side-by-side benchmark drivers (decode.py, train.py).

- `python_for(impl)`: the interpreter an implementation runs under (Tunix has its own venv).
- `cpu_busy()`: how many cores other work kept busy just before a measurement.
- `run_json(impl, cmd, ...)`: run one benchmark process (never two at once), echo and return the
  JSON lines it prints, and record the core-busy sample taken just before it started.
- `versions()`: package versions of the main venv and the Tunix venv.
- `write_section(title, text)`: replace one "## title" section of RESULTS.md, keeping the rest.
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _venvs  # noqa: E402

RESULTS = HERE / "RESULTS.md"
HEADER = """# Benchmark results

Measured on the development machine: 2 CPU cores, about 24 GiB of memory, no accelerator.
Unless a section says otherwise, every implementation runs the same model shape (SmolLM2-135M:
30 layers, width 576, FFN 1536, 9 heads / 3 KV heads, head dim 64, vocab 49152, tied embeddings),
random init, fp32.
Numbers on a shared 2-core machine are noisy (about 10%); compare ratios within one run.

Rerun (each section is rewritten by its own script):

    .venv/bin/python benchmarks/decode.py --write
    .venv/bin/python benchmarks/train.py --write
"""


def python_for(impl: str) -> str:
    return str(_venvs.tunix_python()) if impl == "tunix" else sys.executable


def cpu_busy(seconds: float = 2.0) -> float:
    """How many cores were busy (all processes on the machine) over a short sample."""
    def read():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return sum(v), v[3] + v[4]  # total, idle + iowait
    try:
        t0, i0 = read()
        time.sleep(seconds)
        t1, i1 = read()
    except OSError:
        return float("nan")
    return (os.cpu_count() or 1) * (1 - (i1 - i0) / max(t1 - t0, 1))


def run_json(impl: str, cmd: list[str], *, timeout: float, busy: list[float]) -> list[dict]:
    """Run one benchmark process to completion and return the JSON lines it printed."""
    b = cpu_busy()
    busy.append(b)
    print(f"  (cores busy with other work just before start: {b:.2f} of {os.cpu_count()})",
          flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"{impl} failed with exit code {r.returncode}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        print(f"  {json.dumps(row)}", flush=True)
    print(f"  ({impl}: {time.perf_counter() - t0:.0f} s in all)", flush=True)
    return rows


def busy_line(busy: list[float]) -> str:
    return (f"Cores busy with other work just before each process: {min(busy):.2f} to "
            f"{max(busy):.2f} of {os.cpu_count()} (near 0 on a quiet machine; more means the "
            "numbers were taken while other work competed for the cores).")


def versions(main_pkgs=("jax", "flax", "torch", "transformers"),
             tunix_pkgs=("jax", "flax")) -> dict:
    """Versions in the main venv, and "tunix": "<google-tunix> (jax X, flax Y, ...)"."""
    out = {}
    for pkg in main_pkgs:
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "?"
    names = ("google-tunix",) + tuple(tunix_pkgs)
    code = ("import importlib.metadata as m; "
            f"print(' '.join(m.version(p) for p in {names!r}))")
    r = subprocess.run([str(_venvs.tunix_python()), "-c", code], capture_output=True, text=True)
    got = r.stdout.split() if r.returncode == 0 else ["?"] * len(names)
    out["tunix"] = f"{got[0]} ({', '.join(f'{p} {v}' for p, v in zip(tunix_pkgs, got[1:]))})"
    return out


def write_section(title: str, section: str, path: Path = RESULTS) -> None:
    """Replace the "## {title}" section of `path` (up to the next "## ") with `section`, or append
    it; the file starts from HEADER when missing."""
    text = path.read_text() if path.exists() else HEADER
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == f"## {title}"), None)
    if start is None:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        kept_after = "\n".join(lines[end:])
        new = "\n".join(lines[:start]).rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
        if kept_after:
            new += "\n" + kept_after + "\n"
    path.write_text(new)
