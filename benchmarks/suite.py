"""`make bench`: every side-by-side driver, then one summary of the speed goals.

Runs decode.py, train.py (twice: 4 x 128 rows, then one row of 2,048 tokens), dpo.py, grpo.py
and rollouts.py (each with --write, so each rewrites its own RESULTS.md section and adds its run, dated,
to the tracked benchmarks/figures/DRIVER.json) one after another, never in parallel. From every
driver's figures, each (impl, row) taken from the newest run that measured it (_figures.py says
why a tracked file), this script writes the "## Summary" section near the top of RESULTS.md:
one table with every row (sft, lora, sft 1 x 2048, dpo, decode batch 8 and 32, grpo, the
long-tail and uniform rollouts (hone's paged engine), and hone's bf16 rows) x hone, Tunix and
PyTorch (median step seconds, or tokens per second for decode and rollouts; first-step seconds; peak RSS), the date of the run
each row comes from, hone's speed-up over each and the goals (2x Tunix, 2.5x PyTorch) met,
NOT met or not run (with the reason), and the chart benchmarks/results.png of the speed-ups.
Rerunning one driver alone and then `--summary-only` replaces that driver's rows and keeps the
others with their own dates.

    make bench                                   # the drivers' own rounds and repeats
    make bench BENCH_FLAGS="--rounds 3 --repeats 5"
    .venv/bin/python benchmarks/suite.py --quick  # one round, one repeat: a smoke run
    .venv/bin/python benchmarks/suite.py --summary-only  # after rerunning one driver alone
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402
import _figures  # noqa: E402

DRIVERS = ("decode", "train", "dpo", "grpo", "rollouts")  # the order they run in
# (summary row, driver, the driver's row name, what is compared: "step" s or decode "tok/s").
# A row name "X-bf16" is hone with bf16 compute (fp32 master weights, optimizer and loss),
# compared with the others' fp32 row X (the issue's precision policy row).
ROWS = (("sft", "train", "sft", "step"), ("lora", "train", "lora", "step"),
        ("sft 1 x 2048", "train", "sft 1x2048", "step"),
        ("dpo", "dpo", "dpo", "step"), ("decode batch 8", "decode", "decode-8", "tok/s"),
        ("decode batch 32", "decode", "decode-32", "tok/s"), ("grpo", "grpo", "grpo", "step"),
        ("rollout long-tail", "rollouts", "long-tail", "tok/s"),
        ("rollout uniform", "rollouts", "uniform", "tok/s"),
        ("sft, hone bf16", "train", "sft-bf16", "step"),
        ("lora, hone bf16", "train", "lora-bf16", "step"),
        ("dpo, hone bf16", "dpo", "dpo-bf16", "step"),
        ("decode batch 8, hone bf16", "decode", "decode-8-bf16", "tok/s"),
        ("decode batch 32, hone bf16", "decode", "decode-32-bf16", "tok/s"))
DRIVER_FLAGS = {"train": ["--bf16"], "dpo": ["--bf16"]}  # what each driver runs besides the shared flags
# The driver runs in order: (driver, its own flags; None: DRIVER_FLAGS). The second train.py run
# is one row of 2,048 tokens (its own section and "sft 1x2048" records), so the suite measures
# more than 128-token rows.
LONG_ROW = ["--rows", "sft", "--batch", "1", "--seq-len", "2048"]
RUNS = (("decode", None), ("train", None), ("train", LONG_ROW), ("dpo", None), ("grpo", None),
        ("rollouts", None))
IMPLS = ("hone", "tunix", "torch")
# (driver, impl) pairs with no figures by design, and why (the Summary says it in their place).
NOT_RUN = {("grpo", "torch"): "PyTorch has no GRPO driver",
           ("rollouts", "torch"): "PyTorch has no rollout driver"}
GOALS = {"tunix": 2.0, "torch": 2.5}  # hone at least this many times faster
NAMES = {"hone": "hone", "tunix": "Tunix", "torch": "PyTorch"}
CHART = HERE / "results.png"


def speedup(hone: dict | None, other: dict | None) -> float | None:
    """How many times faster hone is: the other's median step (or decode call) time / hone's;
    None when either was not measured. For decode this is hone's tokens per second / the
    other's (both decode the row's batch x new tokens), computed from the medians because the
    figures recovered from RESULTS.md's tables have tokens per second to one decimal only."""
    if hone is None or other is None:
        return None
    return other["median_s"] / hone["median_s"]


def not_run_reason(figures: dict[str, list[dict]], driver: str, impl: str, name: str) -> str:
    """Why `impl` has no figure for the driver's row `name`."""
    if (driver, impl) in NOT_RUN:
        return NOT_RUN[driver, impl]
    if not figures.get(driver):
        return f"no figures from {driver}.py --write yet"
    return f"{driver}.py's saved runs have no {impl} {name}"


def collect(figures: dict[str, list[dict]]) -> list[dict]:
    """The summary rows from the drivers' saved runs ({driver: runs}, see _figures.py), each
    (impl, row) from the newest run that measured it: each row has "row", "kind", "impls"
    ({impl: record, with its run's "date"}), "missing" ({impl: why it has no figure}) and
    "speedup" ({"tunix": x or None, "torch": ...})."""
    newest = {d: _figures.newest(runs) for d, runs in figures.items()}
    out = []
    for label, driver, name, kind in ROWS:
        base = name.removesuffix("-bf16")
        wanted = {i: name if i == "hone" else base for i in IMPLS}
        got = newest.get(driver, {})
        impls = {i: got[i, n] for i, n in wanted.items() if (i, n) in got}
        missing = {i: not_run_reason(figures, driver, i, n) for i, n in wanted.items()
                   if i not in impls}
        out.append({"row": label, "kind": kind, "impls": impls, "missing": missing,
                    "speedup": {o: speedup(impls.get("hone"), impls.get(o))
                                for o in GOALS}})
    return out


def goal_cell(row: dict) -> str:
    """"2x Tunix: met; 2.5x PyTorch: NOT met", or "not run (why)" for a side without figures."""
    parts = []
    for other, goal in GOALS.items():
        r = row["speedup"][other]
        if r is None:
            why = row["missing"].get("hone") or row["missing"].get(other)
            verdict = f"not run ({why})"
        else:
            verdict = "met" if r >= goal else "NOT met"
        parts.append(f"{goal:g}x {NAMES[other]}: {verdict}")
    return "; ".join(parts)


def date_cell(impls: dict) -> str:
    """The date of the run the row's figures come from; when a later run replaced only some
    implementations' figures, each date with the implementations it holds."""
    dates = {}
    for impl, rec in impls.items():
        dates.setdefault(rec["date"], []).append(impl)
    if len(dates) <= 1:
        return next(iter(dates), "not run")
    return "; ".join(f"{d} ({', '.join(i)})" for d, i in sorted(dates.items(), reverse=True))


def _cell(impls: dict, impl: str, field: str, spec: str) -> str:
    """impls[impl][field] formatted, or "-" where not measured."""
    got = impls.get(impl, {})
    return format(got[field], spec) if field in got else "-"


def _triple(impls: dict, field: str, spec: str) -> str:
    """"a / b / c" for hone / tunix / torch."""
    return " / ".join(_cell(impls, i, field, spec) for i in IMPLS)


def table(rows: list[dict]) -> str:
    head = ["row", "date", "measure", "hone", "tunix", "torch",
            "first step s (hone / tunix / torch)", "peak RSS MB (hone / tunix / torch)",
            "hone/tunix", "hone/torch", "goal"]
    body = []
    for r in rows:
        field, spec = ("tokens_per_s", ".1f") if r["kind"] == "tok/s" else ("median_s", ".3f")
        cells = [r["row"], date_cell(r["impls"]), "tok/s" if r["kind"] == "tok/s" else "step s"]
        cells += ["not run" if i in r["missing"] else _cell(r["impls"], i, field, spec)
                  for i in IMPLS]
        cells += [_triple(r["impls"], "first_s", ".1f"), _triple(r["impls"], "peak_rss_mb", ".0f")]
        cells += ["-" if r["speedup"][o] is None else f"{r['speedup'][o]:.2f}x" for o in GOALS]
        cells.append(goal_cell(r))
        body.append(cells)
    return _driver.md_table(head, body)


def chart(rows: list[dict], path: Path = CHART) -> Path:
    """Bars of hone's speed-up over Tunix and PyTorch per row, with the goals as lines."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(12, 5))
    width = 0.38
    xs = range(len(rows))
    for k, (other, color) in enumerate((("tunix", "tab:blue"), ("torch", "tab:orange"))):
        heights = [r["speedup"][other] or 0.0 for r in rows]
        bars = ax.bar([x + (k - 0.5) * width for x in xs], heights, width, color=color,
                      label=f"vs {NAMES[other]}")
        for bar, r in zip(bars, rows):
            text = "not run" if r["speedup"][other] is None else f"{r['speedup'][other]:.2f}x"
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.axhline(GOALS[other], color=color, linestyle="--", linewidth=1,
                   label=f"goal {GOALS[other]:g}x {NAMES[other]}")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    top = max([r["speedup"][o] or 0.0 for r in rows for o in GOALS] + list(GOALS.values()))
    ax.set_ylim(0, top * 1.25)  # room for the labels and the legend above the bars
    ax.set_xticks(list(xs), [r["row"].replace(", ", "\n").replace("decode ", "decode\n")
                            for r in rows], fontsize=8)
    ax.set_ylabel("hone speed-up (x)")
    ax.set_title("hone's speed-up per benchmark row (higher is better)")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def sources(rows: list[dict]) -> str:
    """"`benchmarks/decode.py --rounds 1 --repeats 3` (2026-12-01); ...": the runs the rows'
    figures come from, in the order the drivers run, newest first within a driver."""
    used = {(rec["date"], rec["command"]) for r in rows for rec in r["impls"].values()}
    out = []
    for d in DRIVERS:
        mine = sorted((u for u in used if u[1].split(" ")[0] == f"benchmarks/{d}.py"),
                      reverse=True)
        out += [f"`{cmd}` ({date})" for date, cmd in mine]
    return "; ".join(out) or "none"


def section(rows: list[dict], command: str) -> str:
    met = sum(r["speedup"][o] is not None and r["speedup"][o] >= g
              for r in rows for o, g in GOALS.items())
    measured = sum(r["speedup"][o] is not None for r in rows for o in GOALS)
    return "\n".join([
        "## Summary", "",
        f"Built {_figures.today()} by `{command}` from the newest figures of every driver "
        "(benchmarks/figures/DRIVER.json, which each driver's --write saves beside its section "
        f"below): {sources(rows)}. date: the day of the run a row's figures come "
        "from; that run's full table is in the driver's section below. measure: the median step "
        "time (s, lower is better) or, for decode and rollouts, tokens per second (higher is "
        "better; a rollout row's hone is its paged engine). The "
        "bf16 rows are hone with bfloat16 compute (float32 master weights, optimizer and loss; "
        "decode: bfloat16 weights) against the others' float32. hone/tunix and hone/torch: how "
        "many times faster hone is (step time ratio, or tokens-per-second ratio). not run: no "
        "figure, for the reason in the goal column.", "",
        table(rows), "",
        f"Goals (hone at least 2x Tunix and 2.5x PyTorch in every row): {met} of {measured} "
        "measured comparisons met.", "",
        f"![hone speed-up per row]({CHART.name})", ""])


def run_driver(name: str, flags: list[str], own: list[str] | None = None) -> None:
    """Run benchmarks/NAME.py --write with the shared `flags` and its `own` (default
    DRIVER_FLAGS[name]) in its own process (it runs its implementations one at a time), which
    rewrites its section and adds its run to figures/NAME.json."""
    saved = _figures.FIGURES / f"{name}.json"
    before = _figures.load_runs(saved)
    cmd = [sys.executable, str(HERE / f"{name}.py"), "--write", *flags,
           *(DRIVER_FLAGS.get(name, []) if own is None else own)]
    print(f"== {' '.join(cmd[1:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True)
    print(f"== {name}.py: {time.perf_counter() - t0:.0f} s", flush=True)
    if _figures.load_runs(saved) == before:
        raise SystemExit(f"{name}.py finished without adding its run to {saved}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=None, help="passed to every driver")
    ap.add_argument("--repeats", type=int, default=None, help="passed to every driver")
    ap.add_argument("--quick", action="store_true", help="--rounds 1 --repeats 1 (smoke run)")
    ap.add_argument("--summary-only", action="store_true",
                    help="run no driver: rewrite the summary from the figures the drivers "
                    "saved (after rerunning one driver alone, e.g. decode.py --write)")
    args = ap.parse_args()
    if args.quick:
        args.rounds, args.repeats = 1, 1
    flags = [f for name in ("rounds", "repeats") if getattr(args, name) is not None
             for f in (f"--{name}", str(getattr(args, name)))]
    if args.summary_only:
        flags = ["--summary-only"]
    else:
        for name, own in RUNS:
            run_driver(name, flags, own)
    figures = _figures.load(DRIVERS)
    rows = collect(figures)
    text = section(rows, " ".join(["benchmarks/suite.py", *flags]))
    chart(rows, CHART)
    _driver.write_section("Summary", text, _driver.RESULTS, top=True)
    print()
    print(text)
    print(f"wrote the Summary section of {_driver.RESULTS} and {CHART}")


if __name__ == "__main__":
    main()
