"""What the code tool's tests share: the layer setups each hostile program runs under, and the
search for processes a run left behind (the `host` fixture in conftest.py uses it)."""

import os

import pytest

from hone.agents.code_tool import CHILD, CodeLimits, sandbox_status

SMALL = dict(wall_s=2.0, cpu_s=1.0, memory_mb=256, output_bytes=4096, file_mb=1, max_processes=8)
CONFINED = pytest.mark.skipif(not sandbox_status().confined,
                              reason=f"no sandbox here: {sandbox_status().reason}")
MODES = {
    "sandbox+audit": pytest.param(CodeLimits(**SMALL), marks=CONFINED),
    "audit": CodeLimits(**SMALL, sandbox="off"),
    "sandbox": pytest.param(CodeLimits(**SMALL, sandbox="require", audit_hook=False),
                            marks=CONFINED),
}
AUDITED = {k: v for k, v in MODES.items() if k != "sandbox"}
SANDBOXED = {k: v for k, v in MODES.items() if k != "audit"}
UNGUARDED = CodeLimits(**SMALL, sandbox="off", audit_hook=False)
# The limits that need neither the sandbox nor the hook hold with neither.
HARD = {**MODES, "rlimits only": UNGUARDED}
MARK = "4242.5"  # the sleep of a background process a snippet tries to leave behind


def leftovers(root: str) -> list[str]:
    """Processes of this test's code runs still alive: the child script, or anything still
    working in a private folder (its cwd), or a marked sleeper. A run's processes carry its
    folder, under `root`, in their command line (the child's config) or as TMPDIR (unconfined),
    so another pytest worker's runs are not counted."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{pid}/stat", "rb") as f:
                if f.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                    continue
            cwd = os.readlink(f"/proc/{pid}/cwd")
            with open(f"/proc/{pid}/environ", "rb") as f:
                env = f.read().decode(errors="replace")
        except OSError:
            continue
        ours = root in cwd or root in env or root in cmd
        if ours and (CHILD in cmd or MARK in cmd or "hone-code-" in cwd):
            found.append(f"{pid}: {cmd[:120]} (cwd {cwd})")
    return found
