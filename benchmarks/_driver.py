"""Pieces shared by the side-by-side benchmark drivers (decode.py, train.py, dpo.py, grpo.py).

- `parser(doc, impls, title)` / `parse(ap, impls)`: the options every driver has (--rounds,
  --repeats, --impls, --timeout, --write) around the driver's own, and the checked impl list.
- `command(impl, script, *flags)`: the command line of one benchmark process.
- `run_rounds(args, jobs)`: run every implementation's processes, round after round, one at a
  time, rotating the order of implementations every round; returns their JSON lines.
- `aggregate(results, keys, key, ...)`: medians over rounds per implementation (and row).
- `md_table(head, rows)`, `cell(summary, key, field, spec)`: a markdown table and its cells.
- `section(...)` / `report(...)`: a RESULTS.md section's common frame; print it, and with
  --write put it into RESULTS.md and the run's aggregated records into figures/NAME.json
  (_figures.py), from which suite.py builds the Summary section.
- `python_for(impl)`: the interpreter an implementation runs under (Tunix has its own venv).
- `cpu_busy()`: how many cores other work kept busy just before a measurement.
- `run_json(impl, cmd, ...)`: run one benchmark process (never two at once), echo and return the
  JSON lines it prints, and record the core-busy sample taken just before it started.
- `child_env()`: its environment, with this checkout's hone first on PYTHONPATH.
- `versions()`: package versions of the main venv and the Tunix venv.
- `write_section(title, text)`: replace one "## title" section of RESULTS.md, keeping the rest.
- `run_row(script, row, env=None)`: rerun `script` with this process's arguments plus
  `--one ROW` (one row per process, so each row's memory and compile are its own), exit with
  its stderr if it fails, echo and return the JSON of its last line.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Iterable

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _figures  # noqa: E402
import _venvs  # noqa: E402

RESULTS = HERE / "RESULTS.md"
BUSY: list[float] = []  # cores busy with other work, sampled before each process
HEADER = """# Benchmark results

Measured on the development machine: 2 CPU cores, about 24 GiB of memory, no accelerator.
Unless a section says otherwise, every implementation runs the same model shape (SmolLM2-135M:
30 layers, width 576, FFN 1536, 9 heads / 3 KV heads, head dim 64, vocab 49152, tied embeddings),
random init, fp32.
Numbers on a shared 2-core machine are noisy (about 10%); compare ratios within one run.

Rerun everything with `make bench` (benchmarks/suite.py: decode.py, train.py, dpo.py and
grpo.py with --write, one after another, then the Summary section and results.png), or one
section with its own script:

    .venv/bin/python benchmarks/decode.py --write
    .venv/bin/python benchmarks/train.py --write
"""


def parser(doc: str, impls: tuple[str, ...], title: str) -> argparse.ArgumentParser:
    """--rounds, --repeats and --impls; parse() adds --timeout and --write after the driver's
    own options. args.title is the RESULTS.md section the driver writes."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--impls", default=",".join(impls))
    ap.set_defaults(title=title)
    return ap


def parse(ap: argparse.ArgumentParser, impls: tuple[str, ...]) -> argparse.Namespace:
    """Parse the command line; args.impls becomes a list of known implementations."""
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per process")
    ap.add_argument("--write", action="store_true",
                    help=f"rewrite '## {ap.get_default('title')}' in {RESULTS.name}")
    args = ap.parse_args()
    args.impls = [i.strip() for i in args.impls.split(",") if i.strip()]
    unknown = set(args.impls) - set(impls)
    if unknown:
        ap.error(f"unknown impls {sorted(unknown)}; choose from {impls}")
    return args


def command(impl: str, script: str, *flags) -> list[str]:
    """[python for impl, benchmarks/script, *flags as strings]."""
    return [python_for(impl), str(HERE / script), *map(str, flags)]


def run_rounds(args, jobs: Callable[[str], list[tuple[str, list[str]]]]) -> list[dict]:
    """Create the Tunix venv first if needed (before any timing); then for each of args.rounds
    rounds, for each implementation in args.impls (the order rotated by one every round), run
    the (label, command) pairs jobs(impl) gives, one process at a time. Returns every JSON line,
    each with "impl" set to the implementation it ran for."""
    impls = args.impls
    if "tunix" in impls:
        _venvs.tunix_python()
    results = []
    for rnd in range(args.rounds):
        for impl in impls[rnd % len(impls):] + impls[:rnd % len(impls)]:
            for label, cmd in jobs(impl):
                print(f"round {rnd + 1}/{args.rounds}: {label}", flush=True)
                for row in run_json(impl, cmd, timeout=args.timeout, busy=BUSY):
                    row["impl"] = impl
                    results.append(row)
    return results


def aggregate(results: list[dict], keys: Iterable, key: Callable[[dict], object],
              medians=("median_s", "first_s"), peak: bool = True, firsts=()) -> dict:
    """{k: summary} for each k in keys (in order) that has results (those with key(r) == k):
    the median over rounds of each field in `medians`, the max "peak_rss_mb" (with peak), the
    first round's value of each field in `firsts` (False where missing) and "runs"."""
    summary = {}
    for k in keys:
        mine = [r for r in results if key(r) == k]
        if mine:
            s = {f: statistics.median(r[f] for r in mine) for f in medians}
            if peak:
                s["peak_rss_mb"] = max(r["peak_rss_mb"] for r in mine)
            s.update({f: mine[0].get(f, False) for f in firsts}, runs=len(mine))
            summary[k] = s
    return summary


def cell(summary: dict, key, field: str, spec: str) -> str:
    """summary[key][field] formatted with `spec`, or "-" where key was not measured."""
    return format(summary[key][field], spec) if key in summary else "-"


def md_table(head: list[str], rows: Iterable[list[str]]) -> str:
    """A markdown table: the head row, its |---| rule, one line per row of cells."""
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows])


def section(args, script: str, settings: str, bullets: dict[str, str], body: list[str],
            goals: list[str] = (), flags: str = "") -> str:
    """A RESULTS.md section: "## {args.title}", when and how it was measured (`settings`), the
    bullets of the implementations run, `body` (each piece followed by ""), the core-busy line
    and `goals` if any."""
    return "\n".join([
        f"## {args.title}", "",
        f"Measured {_figures.today()} with `{run_command(args, script, flags)}`: {settings}",
        "",
        *[line for impl, line in bullets.items() if impl in args.impls], "",
        *body, busy_line(BUSY), "", *([*goals, ""] if goals else [])])


def run_command(args, script: str, flags: str = "") -> str:
    """How a section and its figures name the run: "benchmarks/SCRIPT --rounds R --repeats N"
    and the driver's own `flags`."""
    return f"benchmarks/{script} --rounds {args.rounds} --repeats {args.repeats}{flags}"


def report(args, text: str, script: str, records: list[dict], flags: str = "") -> None:
    """Print the section; with --write, also put it into RESULTS.md and this run's records
    (one dict per (impl, row) with at least "impl" and "row") into figures/NAME.json, dated
    like the section, so the Summary keeps them until a newer run of the same rows."""
    print()
    print(text)
    if args.write:
        write_section(args.title, text, RESULTS)
        name = script.removesuffix(".py")
        saved = _figures.add_run(name, {
            "date": _figures.today(), "command": run_command(args, script, flags),
            "rounds": args.rounds, "repeats": args.repeats, "records": records})
        print(f"wrote the {args.title} section of {RESULTS} and its figures to {saved}")


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
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=child_env())
    if r.returncode != 0:
        sys.stderr.write(r.stderr[-4000:])
        raise SystemExit(f"{impl} failed with exit code {r.returncode}")
    rows = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    for row in rows:
        print(f"  {json.dumps(row)}", flush=True)
    print(f"  ({impl}: {time.perf_counter() - t0:.0f} s in all)", flush=True)
    return rows


def child_env() -> dict:
    """The environment of a benchmark process: PYTHONPATH starts with this checkout, so it
    times the checkout's hone (a script's own folder, not the working directory, heads its
    sys.path, so it would otherwise import whichever hone the venv has installed)."""
    extra = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parent)] + ([extra] if extra
                                                                              else []))}


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


def write_section(title: str, section: str, path: Path = RESULTS, top: bool = False) -> None:
    """Replace the "## {title}" section of `path` (up to the next "## ") with `section`; when
    there is none, append it, or with `top` put it before the first "## " section. The file
    starts from HEADER when missing."""
    text = path.read_text() if path.exists() else HEADER
    lines = text.splitlines()
    start = next((i for i, l in enumerate(lines) if l.strip() == f"## {title}"), None)
    first = next((i for i, l in enumerate(lines) if l.startswith("## ")), None)
    if start is None and top and first is not None:
        new = ("\n".join(lines[:first]).rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n\n"
               + "\n".join(lines[first:]) + "\n")
    elif start is None:
        new = text.rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")),
                   len(lines))
        kept_after = "\n".join(lines[end:])
        new = "\n".join(lines[:start]).rstrip("\n") + "\n\n" + section.rstrip("\n") + "\n"
        if kept_after:
            new += "\n" + kept_after + "\n"
    path.write_text(new)


def run_row(script: str, row: str, env: dict | None = None) -> dict:
    """One row of a single-script benchmark in a process of its own (see the module doc)."""
    done = subprocess.run([sys.executable, script, *sys.argv[1:], "--one", row],
                          capture_output=True, text=True, cwd=HERE.parent, env=env)
    if done.returncode != 0:
        sys.exit(f"{row} failed:\n{done.stderr[-3000:]}")
    out = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(out), flush=True)
    return out
