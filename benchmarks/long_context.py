"""Long rows: peak memory and step time of one full SFT step on a single row of 1k to 32k tokens,
hone beside PyTorch + transformers (sdpa), both with gradient checkpointing.

Each (implementation, length) is one process of train_hone.py or train_torch.py (`--rows sft
--batch 1 --seq-len L --remat full`; PyTorch: `gradient_checkpointing_enable()`), run one after
another, never in parallel, so each peak RSS is that row's alone. Model: SmolLM2-135M shape,
random init, fp32, AdamW after global-norm clipping (train.py's step). A process is watched while
it runs: it is killed when its resident memory passes --max-gb (so a long row cannot push the
machine's other work into the kernel's out-of-memory killer) or when it runs past --timeout;
that length is then reported as "out of memory (killed at N GB)" or "over T s", and the next
runs. The load average is recorded beside each process, since step times on a shared machine
are inflated by whatever else runs.

Tunix is not among the implementations: its step (train_tunix.py) takes no gradient
checkpointing here, so it could not run the same step (train_tunix.py rejects --remat).

--write adds this run's records to benchmarks/figures/long_context.json (runs of other lengths
or implementations stay there) and rewrites the "## Long rows" section of RESULTS.md from the
newest record of every (implementation, length), each with its date, repeats and load.

    .venv/bin/python benchmarks/long_context.py --lengths 1024,2048 --repeats 1 --write
    .venv/bin/python benchmarks/long_context.py --impls hone --lengths 4096,8192 --repeats 0 --write
"""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import _driver  # noqa: E402
import _figures  # noqa: E402

IMPLS = ("hone", "torch")
LENGTHS = (1024, 2048, 4096, 8192, 16384, 32768)
# SmolLM2-135M's parameter count; params, grads and AdamW's two moments in fp32: 16 B each.
PARAMS = 134_515_008
STATE_GB = 16 * PARAMS / 1e9


def row_name(length: int) -> str:
    return f"sft-{length}"


def rss_kb(pid: int) -> int:
    """The resident set of one process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def watched(cmd: list[str], timeout: float, max_gb: float) -> tuple[list[dict], str, float]:
    """Run one process, polling its RSS twice a second; (JSON lines, status, watched peak GB).
    status is "ok", "out of memory (killed at N GB)" (or "(XLA asked for N GB)" when XLA
    could not allocate its buffers), "over T s" or "failed (exit code N)"."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=_driver.child_env())  # this checkout's hone
    t0, peak, status = time.monotonic(), 0.0, "ok"
    while proc.poll() is None:
        peak = max(peak, rss_kb(proc.pid) / 1e6)
        if peak > max_gb:
            status = f"out of memory (killed at {peak:.1f} GB)"
        elif time.monotonic() - t0 > timeout:
            status = f"over {timeout:.0f} s"
        if status != "ok":
            proc.kill()
            break
        time.sleep(0.5)
    out, err = proc.communicate()
    asked = re.search(r"RESOURCE_EXHAUSTED: Out of memory allocating (\d+) bytes", err)
    if status == "ok" and proc.returncode == -9:  # the kernel's out-of-memory killer
        status = f"out of memory (killed by the system at {peak:.1f} GB)"
    elif status == "ok" and asked:  # XLA could not allocate the program's buffers
        status = f"out of memory (XLA asked for {int(asked.group(1)) / 1e9:.1f} GB)"
    elif status == "ok" and proc.returncode != 0:
        sys.stderr.write(err[-3000:])
        status = f"failed (exit code {proc.returncode})"
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows, status, peak


def run(args) -> list[dict]:
    """One process per (impl, length), impls in order, lengths in order; one record each."""
    records = []
    for impl in args.impls:
        for length in args.lengths:
            cmd = _driver.command(impl, f"train_{impl}.py", "--rows", "sft", "--batch", 1,
                                  "--seq-len", length, "--repeats", args.repeats,
                                  "--remat", args.remat)
            busy = _driver.cpu_busy()
            _driver.BUSY.append(busy)
            load0 = os.getloadavg()[0]
            print(f"{impl} {length}: cores busy {busy:.2f}, load average {load0:.2f}",
                  flush=True)
            t0 = time.monotonic()
            rows, status, peak = watched(cmd, args.timeout, args.max_gb)
            load = max(load0, os.getloadavg()[0])
            rec = {"impl": impl, "row": row_name(length), "length": length, "status": status,
                   "repeats": args.repeats, "remat": args.remat, "load_avg": round(load, 2),
                   "cores_busy": round(busy, 2), "wall_s": round(time.monotonic() - t0, 1),
                   "date": _figures.today()}
            if impl == "hone":  # train_row's blocks: train.scan_layers auto scans with remat
                # "stored": scanned over weights the train state stores stacked
                # (hone/models/stacked.py); records of "scan" stacked them inside the step
                rec["blocks"] = "loop" if args.remat == "none" else "stored"
            if rows:
                r = rows[-1]
                rec |= {k: r[k] for k in ("first_s", "median_s", "peak_rss_mb", "first_loss")}
                if rec["median_s"] != rec["median_s"]:  # nan: --repeats 0, first step only
                    rec["median_s"] = None  # (strict JSON in figures/)
            else:
                rec["peak_rss_mb"] = round(peak * 1e3, 1)  # the watched peak when it was killed
            print(f"  {json.dumps(rec)}", flush=True)
            records.append(rec)
    return records


def _gb(rec: dict | None) -> str:
    if rec is None or "XLA asked" in rec["status"]:  # failed before its buffers existed
        return "-"
    return f"{rec['peak_rss_mb'] / 1e3:.2f}"


def _step(rec: dict | None, field: str) -> str:
    if rec is None:
        return "not run"
    if rec["status"] != "ok":
        return rec["status"] if field == "first_s" else "-"
    v = rec.get(field)
    return "-" if v is None else f"{v:.1f}"  # None: no repeats


def table(recs: dict, impls, lengths) -> str:
    head = ["tokens"]
    for i in impls:
        head += [f"{i} first step s", f"{i} step s", f"{i} peak GB", f"{i} load avg"]
    head += ["hone/torch peak"]
    rows = []
    for n in lengths:
        cells = [str(n)]
        for i in impls:
            r = recs.get((i, row_name(n)))
            cells += [_step(r, "first_s"), _step(r, "median_s"), _gb(r),
                      "-" if r is None else f"{r['load_avg']:.1f}"]
        h, t = recs.get(("hone", row_name(n))), recs.get(("torch", row_name(n)))
        ok = h and t and h["status"] == t["status"] == "ok"
        cells.append(f"{h['peak_rss_mb'] / t['peak_rss_mb']:.2f}" if ok else "-")
        rows.append(cells)
    return _driver.md_table(head, rows)


def _ok(recs, impl, n):
    r = recs.get((impl, row_name(n)))
    return r if r is not None and r["status"] == "ok" else None


def goal_lines(recs: dict) -> list[str]:
    """The long-sequence issue's goals, each met / NOT met / not measured."""
    def verdict(ok):
        return "met" if ok else "NOT met"
    out = ["Goals (the long-sequence issue):"]
    h, t = _ok(recs, "hone", 2048), _ok(recs, "torch", 2048)
    if h and t and h["median_s"] is not None and t["median_s"] is not None:
        out.append(f"- 2k: hone ahead of PyTorch in step time ({h['median_s']:.1f} vs "
                   f"{t['median_s']:.1f} s) and peak memory ({_gb(h)} vs {_gb(t)} GB): "
                   f"{verdict(h['median_s'] < t['median_s'] and h['peak_rss_mb'] < t['peak_rss_mb'])}")
    else:
        out.append("- 2k ahead of PyTorch in step time and peak memory: not measured")
    for n, cap in ((16384, 10), (32768, 16)):
        r = recs.get(("hone", row_name(n)))
        if r is None:
            out.append(f"- {n // 1024}k within {cap} GB peak: not measured")
        elif r["status"] != "ok":
            out.append(f"- {n // 1024}k within {cap} GB peak: NOT met ({r['status']})")
        else:
            out.append(f"- {n // 1024}k within {cap} GB peak ({_gb(r)} GB): "
                       f"{verdict(r['peak_rss_mb'] / 1e3 <= cap)}")
    a, b = _ok(recs, "hone", 2048), _ok(recs, "hone", 16384)
    if a and b:
        ratio = (b["peak_rss_mb"] / 1e3 - STATE_GB) / (a["peak_rss_mb"] / 1e3 - STATE_GB)
        out.append(f"- peak above model state ({STATE_GB:.2f} GB: fp32 params, grads, AdamW "
                   f"moments) at 16k is {ratio:.1f}x that at 2k (at most ~8-10x): "
                   f"{verdict(ratio <= 10)}")
    else:
        out.append("- memory above model state at 16k at most ~8-10x that at 2k: not measured")
    a, b = _ok(recs, "hone", 1024), _ok(recs, "hone", 8192)
    if a and b:
        per = [r["first_s"] if r["median_s"] is None else r["median_s"] for r in (a, b)]
        ratio = (per[1] / 8192) / (per[0] / 1024)
        out.append(f"- step time per token at 8k {ratio:.2f}x that at 1k (at most 1.5x; "
                   "compares medians, or first steps where a length ran only one; load "
                   f"averages differ): {verdict(ratio <= 1.5)}")
    else:
        out.append("- step time per token at 8k at most 1.5x that at 1k: not measured")
    return out


def blocks_line(recs: dict, lengths) -> str:
    """Which hone rows ran the blocks as a scan (train.scan_layers) and which as the loop:
    records from before the scan carry no "blocks" and ran the loop."""
    runs = {"stored": [], "scan": [], "loop": []}
    for n in lengths:
        r = recs.get(("hone", row_name(n)))
        if r is not None:
            runs[r.get("blocks", "loop")].append(str(n))
    return (f"hone's blocks: a scan (train.scan_layers auto) over weights the train state stores "
            f"stacked at {', '.join(runs['stored']) or 'no length'}; a scan over weights stacked "
            f"inside the step (records from before the stored stacks, whose step held about "
            f"1.4 GB more) at {', '.join(runs['scan']) or 'no length'}; the Python loop (records "
            f"from before train.scan_layers) at {', '.join(runs['loop']) or 'no length'}.")


def other_remats(others: dict) -> str:
    """hone's rows under remat settings other than full, one table per setting, each length's
    step time per token against that setting's 1k row."""
    out = []
    for remat in sorted({m for m, _ in others}):
        rows = sorted((r for (m, _), r in others.items() if m == remat),
                      key=lambda r: r["length"])
        base = next((r for r in rows if r["length"] == 1024 and r["status"] == "ok"), None)
        cells = []
        for r in rows:
            per = r["first_s"] if r.get("median_s") is None else r["median_s"]
            ratio = "-"
            if base is not None and r["status"] == "ok":
                b = base["first_s"] if base.get("median_s") is None else base["median_s"]
                ratio = f"{(per / r['length']) / (b / 1024):.2f}"
            cells.append([str(r["length"]), _step(r, "first_s"), _step(r, "median_s"), _gb(r),
                          f"{r['load_avg']:.1f}", ratio, r["date"]])
        out += ["", f"hone with `train.remat: {remat}` (the same step otherwise; per token: step "
                "time per token against this setting's 1k row, medians or first steps as "
                "above):", "",
                _driver.md_table(["tokens", "first step s", "step s", "peak GB", "load avg",
                                  "per token / 1k", "date"], cells)]
    return "\n".join(out) + "\n" if out else ""


def section(recs: dict, vers: dict, lengths, max_gb: float) -> str:
    dates = sorted({r["date"] for r in recs.values()})
    lines = [
        "## Long rows", "",
        f"Measured {', '.join(dates)} with `benchmarks/long_context.py` (one process per "
        "implementation and length, one at a time): one full SFT step on ONE row of L random "
        "tokens (batch 1, all real, loss on every token), SmolLM2-135M shape, random init, fp32, "
        "AdamW after global-norm clipping at 1.0, gradient checkpointing of every block "
        "(hone `--remat full`, attention `auto`, head_chunk 1024 as `hone sft` builds them; "
        "PyTorch `gradient_checkpointing_enable()`, sdpa, 2 threads). First step includes "
        "trace and compile; \"step s\" is the median of the steps after it (\"-\" where a "
        "length ran its first step only). Peak GB: the process's peak resident memory. Load "
        "avg: the 1-minute load average at the start or end of the process, whichever was "
        "higher, on this 2-core machine shared with other work; step times are inflated by it, "
        "memory is not.", "",
        f"- hone: benchmarks/train_hone.py (`hone.bench.rows.train_row`); jax {vers['jax']}, "
        f"flax {vers['flax']}.",
        f"- torch: benchmarks/train_torch.py; torch {vers['torch']}, transformers "
        f"{vers['transformers']}.",
        "- tunix: not run (its step in train_tunix.py takes no gradient checkpointing here).",
        "", table(recs, IMPLS, lengths), "", blocks_line(recs, lengths), "",
        f"Out of memory: killed when its resident memory passed {max_gb:g} GB (--max-gb; the "
        "machine's 23 GiB are shared with other work, so a row is never allowed near the "
        "kernel's out-of-memory killer), or XLA failed to allocate a buffer of the size given "
        "before the step ran. \"not run\": not measured (time).", "",
        *goal_lines(recs), ""]
    return "\n".join(lines)


def main():
    ap = _driver.parser(__doc__, IMPLS, "Long rows")
    ap.set_defaults(repeats=1)
    ap.add_argument("--lengths", default=",".join(map(str, LENGTHS)))
    # The main table and goals are remat full's; hone's rows under another setting (e.g.
    # save_attention) are kept apart and tabled below them, with their own per-token ratio.
    ap.add_argument("--remat", default="full",
                    choices=("none", "full", "save_dots", "save_attention"))
    ap.add_argument("--max-gb", type=float, default=18.0,
                    help="kill a process whose resident memory passes this (GB)")
    ap.add_argument("--report-only", action="store_true",
                    help="run nothing: rebuild the section from the saved figures")
    args = _driver.parse(ap, IMPLS)
    if not any(a.startswith("--timeout") for a in sys.argv[1:]):
        args.timeout = 1800.0  # per process, not the other drivers' hour
    args.lengths = [int(x) for x in args.lengths.split(",") if x.strip()]
    records = [] if args.report_only else run(args)
    if args.write and records:
        _figures.add_run("long_context", {
            "date": _figures.today(), "command": "benchmarks/long_context.py",
            "rounds": 1, "repeats": args.repeats, "records": records})
    runs = _figures.load_runs(_figures.FIGURES / "long_context.json") if args.write else [
        {"date": _figures.today(), "records": records}]
    if args.remat != "full" and args.impls != ["hone"]:
        ap.error("--remat other than full compares hone's settings: give --impls hone")
    every = {}
    for r in _figures.ordered(runs):
        every |= {(rec["impl"], rec["row"], rec.get("remat", "full")): rec
                  for rec in r["records"]}
    recs = {(i, row): rec for (i, row, m), rec in every.items() if m == "full"}
    others = {(m, row): rec for (i, row, m), rec in every.items() if m != "full"}
    lengths = sorted(set(LENGTHS) | {rec["length"] for rec in recs.values()})
    vers = {p: md.version(p) for p in ("jax", "flax", "torch", "transformers")}
    text = section(recs, vers, lengths, args.max_gb) + other_remats(others)
    print()
    print(text)
    if args.write:
        _driver.write_section("Long rows", text, _driver.RESULTS)
        print(f"wrote the Long rows section of {_driver.RESULTS}")


if __name__ == "__main__":
    main()
