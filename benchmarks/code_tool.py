"""The code tool's cost per call: the time to start a fresh child, run a small program and collect
its result (`hone.agents.code_tool.run_code`), confined in its sandbox and not, and through a
ToolRunner worker as an episode's tool call runs it (`run_python`).

    .venv/bin/python benchmarks/code_tool.py [--calls 40] [--write]

Each row is the median (and 90th percentile) of `--calls` sequential calls after one warm-up
call; nothing else should run beside it. It also runs on a checkout from before the sandbox
(`PYTHONPATH=OLD_CHECKOUT python benchmarks/code_tool.py`): the limits' field was then
`namespaces`, which it reads when `sandbox` is absent. `--write` appends the table to
benchmarks/RESULTS.md under "The code tool's sandbox".
"""

from __future__ import annotations

import argparse
import dataclasses
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = {"print(1)": "print(1)",
            "json + math": "import json, math\nprint(json.dumps([math.sqrt(2)] * 3))"}


def limits(confined: bool):
    from hone.agents.code_tool import CodeLimits
    names = {f.name for f in dataclasses.fields(CodeLimits)}
    key = "sandbox" if "sandbox" in names else "namespaces"  # before the sandbox: namespaces
    return CodeLimits(**{key: "require" if confined else "off"})


def timed(fn, calls: int) -> tuple[float, float]:
    fn()  # warm-up: the sandbox probe and plan, the first fork
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def machine() -> str:
    out = subprocess.run([sys.executable, str(ROOT / "scripts/machine.py")], capture_output=True,
                         text=True)
    return out.stdout.strip().removeprefix("machine: ") or platform.processor()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=40)
    ap.add_argument("--write", action="store_true")
    args = ap.parse_args()
    from hone.agents import code_tool
    from hone.agents.environment import ToolEnvironment
    from hone.agents.tool_runner import ToolRunner
    rows = []
    for confined in (True, False):
        for name, code in PROGRAMS.items():
            lim = limits(confined)
            median, p90 = timed(lambda: code_tool.run_code(code, lim), args.calls)
            rows.append((f"run_code, {name}", "confined" if confined else "unconfined",
                         median, p90))
    call = ('<tool_call>\n{"name": "run_python", "arguments": {"code": "print(1)"}}\n'
            '</tool_call>')
    with ToolRunner(max_workers=1) as runner:
        env = ToolEnvironment([code_tool.run_python], reward=lambda **kw: 1.0, runner=runner)
        env.reset({"prompt": "x"})
        median, p90 = timed(lambda: env.step(call), args.calls)
    rows.append(("run_python tool call in a ToolRunner worker, print(1)", "default", median, p90))
    lines = [f"Machine: {machine()}; {args.calls} calls a row, medians (p90).", "",
             "| call | mode | median s | p90 s |", "|---|---|---|---|"]
    lines += [f"| {r[0]} | {r[1]} | {r[2]:.4f} | {r[3]:.4f} |" for r in rows]
    print("\n".join(lines))
    if args.write:
        with open(ROOT / "benchmarks/RESULTS.md", "a") as f:
            f.write("\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
