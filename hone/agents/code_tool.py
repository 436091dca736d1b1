"""The Python code tool: the model's code runs in a fresh, limited child process.

`run_python(code)` is a tool like the calculator (type hints and a docstring, so `tool_schema`
describes it and `ToolEnvironment(tools=[run_python])` runs it in a ToolRunner worker);
`run_code(code, CodeLimits(...))` is the same with chosen limits and a structured result.

Design choices:

- One run, one process tree: a fresh interpreter (`python -I -S -u`, the host's executable, the
  standard library only) in a new session, with a fixed minimal environment (HOME the private
  folder, TMPDIR, PATH, the locale; nothing of the host's), stdin closed.
- Confined (the default, where the kernel allows it): the child runs in new user, mount,
  network, PID, IPC and UTS namespaces (`unshare`) with a root of its own, built from read-only
  binds of exactly what the interpreter needs, its private folder read-write, a private /tmp
  and its own /proc (hone/agents/code_sandbox.py says what is in it); the program cannot read,
  write or list anything else of the host, reach the network, or see the host's processes,
  and has no capability over the namespaces it is in. `sandbox="auto"` confines where a probe
  (once per process) shows the sandbox works and otherwise refuses to run, unless the caller
  accepts an unconfined tool (`CodeLimits(unconfined=True)`, or the environment variable
  HONE_CODE_TOOL_UNCONFINED=1, which a run's `agent.code_tool.unconfined: true` sets for its
  tool workers); `"require"` always refuses without it; `"off"` never confines (tests, trusted
  code).
- Layers. Hard, enforced by the kernel or this process: the sandbox, resource limits (CPU
  seconds, address space, file size, open files, processes, no core files), the wall clock and
  the output cap (the host kills the whole process group and sweeps the session). Soft: an audit
  hook in the child (hone/agents/code_child.py) that refuses processes, signals, sockets, ctypes
  and writes outside the folder from Python code; it is not a boundary against native code.
- Output is read incrementally from both pipes into a bounded buffer; past `output_bytes` the run
  is killed and the text marked as cut, so a flood never fills the host's memory.
- RLIMIT_NPROC does not bind root (the kernel exempts it), so the host also counts the session's
  processes every tick and kills the run past `max_processes`.
- `wall_s` must stay below the ToolRunner's timeout (agent.tool_timeout_s): a worker killed by
  it cannot kill the run, which then lasts until the child's own alarm, a few seconds later.
"""

from __future__ import annotations

import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Literal

from hone.agents.code_sandbox import (PROBE, UNSHARE, WORK, planned_view, root_plan, run_plan,
                                      unavailable_reason)

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_child.py")
UNCONFINED_ENV = "HONE_CODE_TOOL_UNCONFINED"  # "1": accept an unconfined tool (module docstring)
TICK_S = 0.05  # how often the host looks at the clock and counts the run's processes
EXTRA_PROCESSES = 3  # unshare, the supervisor and the runner, besides the snippet's own


@dataclass(frozen=True)
class CodeLimits:
    """Limits of one code run. The defaults fit a ToolRunner call of 10 s."""
    wall_s: float = 5.0  # wall-clock seconds, startup included; then the process group is killed
    cpu_s: float = 4.0  # CPU seconds of each process (RLIMIT_CPU, rounded up to whole seconds)
    memory_mb: int = 512  # address space of each process (RLIMIT_AS); numpy alone maps ~100 MB
    output_bytes: int = 8192  # stdout + stderr kept; past it the run is killed and marked cut
    file_mb: int = 16  # largest file the run may write (RLIMIT_FSIZE)
    max_processes: int = 16  # processes and threads the snippet may add (RLIMIT_NPROC, host count)
    open_files: int = 64  # descriptors per process (RLIMIT_NOFILE)
    tmp_mb: int = 64  # size of the confined run's private /tmp (a tmpfs: host memory)
    sandbox: Literal["auto", "require", "off"] = "auto"  # its own root and namespaces
    unconfined: bool = False  # with sandbox="auto": run unconfined where no sandbox works here
    audit_hook: bool = True  # the in-child guard against processes, signals, sockets, writes


@dataclass
class CodeResult:
    """What one run did."""
    exit_code: int | None  # the snippet's exit status; None when it was killed
    signal: int | None  # the signal that ended it, if one did
    stdout: str
    stderr: str
    killed: str | None  # the limit that stopped it: wall_s, cpu_s, output_bytes, max_processes
    output_cut: bool  # stdout + stderr went past output_bytes and were cut there
    sandboxed: bool  # it ran confined: its own root and namespaces


@dataclass(frozen=True)
class SandboxStatus:
    """Whether the code tool can confine its child here, and why not."""
    confined: bool
    reason: str | None  # why not, when not
    view: tuple[str, ...]  # the top-level names the child sees (planned, or seen by the probe)


class UnconfinedError(RuntimeError):
    """The code tool would run unconfined (the host readable) and nobody accepted that."""


def _refusal(reason: str | None) -> str:
    return (f"the code tool cannot confine the program here ({reason}), and would run it "
            f"with every file of this user readable: accept that with agent.code_tool.unconfined:"
            f" true, or run hone where user namespaces work")


def accepts_unconfined(limits: CodeLimits) -> bool:
    return limits.unconfined or os.environ.get(UNCONFINED_ENV) == "1"


def confined_here(limits: CodeLimits) -> bool:
    """Whether a run with `limits` is confined; raises UnconfinedError where it must be and
    cannot (module docstring)."""
    if limits.sandbox == "off":
        return False
    status = sandbox_status()
    if status.confined:
        return True
    if limits.sandbox == "require" or not accepts_unconfined(limits):
        raise UnconfinedError(_refusal(status.reason) + f" (CodeLimits(unconfined=True), or "
                              f"{UNCONFINED_ENV}=1)")
    return False


def session_pids(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # it just ended
            continue
        # fields: state, ppid, pgrp, session, ... (after the command name in parentheses)
        if fields[0] not in (b"Z", b"X") and int(fields[3]) == sid:
            found.append(int(name))
    return found


def kill_session(sid: int, timeout_s: float = 5.0) -> None:
    """SIGKILL process group `sid` and any process left in session `sid`, until none is left."""
    deadline = time.monotonic() + timeout_s
    try:
        os.killpg(sid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    while (left := session_pids(sid)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.005)


def has_exited(pid: int) -> bool:
    """Whether child `pid` has ended, without reaping it (so its pid and group stay ours)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def run_code(code: str, limits: CodeLimits = CodeLimits()) -> CodeResult:
    """Run Python `code` in a fresh limited process; every outcome is a CodeResult. Raises
    UnconfinedError where the run must be confined and cannot be."""
    return _run(code, limits, confined_here(limits))


@functools.lru_cache(maxsize=1)
def sandbox_status() -> SandboxStatus:
    """Whether a confined run works here: the root plans (hone/agents/code_sandbox.py) and a probe
    program run in it sees exactly the planned top-level names. Once per process (about one
    tool call's time)."""
    reason = unavailable_reason()
    if reason is not None:
        return SandboxStatus(False, reason, ())
    try:
        view = planned_view(root_plan())
    except (OSError, subprocess.SubprocessError) as err:
        return SandboxStatus(False, f"the sandbox's root cannot be planned: {err}", ())
    result = _run(PROBE, CodeLimits(wall_s=10.0, cpu_s=5.0), True)
    seen = tuple(result.stdout.split())
    if result.exit_code != 0 or seen != view:
        detail = (result.stderr.strip().splitlines() or [f"exit code {result.exit_code}"])[-1]
        if result.exit_code == 0:
            detail = f"the probe saw {list(seen)}, not {list(view)}"
        return SandboxStatus(False, f"a sandboxed probe failed: {detail}", seen)
    return SandboxStatus(True, None, view)


def _run(code: str, limits: CodeLimits, confined: bool) -> CodeResult:
    base = tempfile.mkdtemp(prefix="hone-code-")
    try:
        folder = os.path.join(base, "work")  # the private folder; base/root: the new root
        os.mkdir(folder, 0o700)
        with open(os.path.join(folder, "snippet.py"), "w", encoding="utf-8") as f:
            f.write(code)
        root = None
        if confined:
            os.mkdir(os.path.join(base, "root"), 0o700)
            root = run_plan(root_plan(), folder, os.path.join(base, "root"), limits.tmp_mb)
        return _run_in(folder, limits, root)
    finally:
        _remove(base)


def _run_in(folder: str, limits: CodeLimits, root: dict | None) -> CodeResult:
    status_r, status_w = os.pipe()
    cfg = {"status_fd": status_w, "wall_s": limits.wall_s, "cpu_s": limits.cpu_s,
           "memory_mb": limits.memory_mb, "file_mb": limits.file_mb,
           "open_files": limits.open_files, "max_processes": limits.max_processes,
           "namespaces": root is not None, "audit_hook": limits.audit_hook, "root": root}
    argv = [sys.executable, "-I", "-S", "-u", CHILD, json.dumps(cfg)]
    home = folder if root is None else WORK
    env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home if root is None else "/tmp",
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    try:
        proc = subprocess.Popen(UNSHARE + argv if root is not None else argv, cwd=folder, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, pass_fds=(status_w,),
                                start_new_session=True)
    except BaseException:
        os.close(status_r)
        raise
    finally:
        os.close(status_w)
    try:
        out, err, status, killed, cut = _watch(proc, status_r, limits)
    finally:
        kill_session(proc.pid)  # stragglers of a run that ended by itself, too
        proc.wait()
        for f in (proc.stdout, proc.stderr):
            f.close()
        os.close(status_r)
    report = json.loads(status.decode().splitlines()[0]) if status.strip() else {}
    # The kernel signals at its own count of CPU time (tick-sampled); the child's rusage is the
    # scheduler's, which a busy host leaves well below it (CI saw SIGXCPU with too little spent
    # for a 0.05 s margin). Half the limit still tells the limit from a snippet killing itself.
    if killed is None and report.get("signal") in (signal.SIGXCPU, signal.SIGKILL) and (
            report.get("cpu_s", 0.0) >= 0.5 * max(1, -(-limits.cpu_s // 1))):
        killed = "cpu_s"
    exit_code = None if killed else report.get("exit")
    sig = report.get("signal")
    if exit_code is None and sig is None and proc.returncode < 0:
        sig = -proc.returncode
    if exit_code is None and sig is None and not killed and "exit" not in report:
        exit_code = proc.returncode  # no report: the supervisor itself died
    return CodeResult(exit_code, sig, out.decode(errors="replace"), err.decode(errors="replace"),
                      killed, cut, root is not None)


def _watch(proc: subprocess.Popen, status_r: int, limits: CodeLimits):
    """Read the pipes until the run ends or breaks a limit (then kill it); drain what is left."""
    bufs = {proc.stdout.fileno(): bytearray(), proc.stderr.fileno(): bytearray(),
            status_r: bytearray()}
    sel = selectors.DefaultSelector()
    for fd in bufs:
        os.set_blocking(fd, False)
        sel.register(fd, selectors.EVENT_READ)
    deadline = time.monotonic() + limits.wall_s
    killed, cut = None, False

    def read_ready(timeout: float) -> None:
        nonlocal cut
        for key, _ in sel.select(timeout):
            try:
                chunk = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not chunk:
                sel.unregister(key.fd)
                continue
            if key.fd == status_r:
                bufs[status_r] += chunk[:4096]
                continue
            room = limits.output_bytes - len(bufs[proc.stdout.fileno()]) - len(
                bufs[proc.stderr.fileno()])
            bufs[key.fd] += chunk[:max(room, 0)]
            cut = cut or len(chunk) > room

    while sel.get_map():
        now = time.monotonic()
        if now >= deadline:
            killed = "wall_s"
        elif cut:
            killed = "output_bytes"
        elif len(session_pids(proc.pid)) > limits.max_processes + EXTRA_PROCESSES:
            killed = "max_processes"
        elif has_exited(proc.pid):
            break
        if killed:
            break
        read_ready(min(TICK_S, deadline - now))
    kill_session(proc.pid)  # every writer is dead now: the pipes reach their end
    drain_until = time.monotonic() + 1.0
    while sel.get_map() and time.monotonic() < drain_until:
        read_ready(0.05)
    sel.close()  # a cut while draining marks the text; the run had ended by itself
    return (bytes(bufs[proc.stdout.fileno()]), bytes(bufs[proc.stderr.fileno()]),
            bytes(bufs[status_r]), killed, cut)


def _remove(folder: str) -> None:
    """Remove the run's folder, even where the snippet took away its own permissions (a folder
    it made unreadable or unwritable cannot be emptied until its mode is given back)."""
    os.chmod(folder, 0o700)
    for parent, dirs, _ in os.walk(folder):  # top-down: each folder's mode is fixed before
        for name in dirs:                      # os.walk lists it
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, 0o700)
    shutil.rmtree(folder)


REASONS = {"wall_s": "the wall-clock limit of {wall_s:g} s",
           "cpu_s": "the CPU-time limit of {cpu_s:g} s",
           "output_bytes": "the output limit of {output_bytes} bytes",
           "max_processes": "the limit of {max_processes} processes"}


def format_result(result: CodeResult, limits: CodeLimits = CodeLimits()) -> str:
    """The text a model reads: how the run ended, then its stdout and stderr."""
    if result.killed:
        head = "killed: it reached " + REASONS[result.killed].format(**vars(limits))
    elif result.signal is not None:
        head = f"killed by signal {signal.Signals(result.signal).name}"
    else:
        head = f"exit code {result.exit_code}"
    parts = [head]
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            parts.append(f"{name}:\n{text.rstrip(chr(10))}")
    if result.output_cut:
        parts.append(f"[output cut at {limits.output_bytes} bytes]")
    return "\n".join(parts)


def run_python(code: str) -> str:
    """Run a Python program and return its exit code, stdout and stderr.

    The program runs in a fresh Python 3 process with the standard library, in an empty working
    folder it may write files in, with no network and limits of 5 s, 512 MB and 8 KB of output.
    Print what you want to see.

    Args:
        code: The complete program, for example "print(sum(range(10)))".
    """
    limits = CodeLimits()
    return format_result(run_code(code, limits), limits)


run_python.uses_code_sandbox = True  # the agent factory checks the sandbox before a run starts


def confinement(accept_unconfined: bool) -> str:
    """The line a run logs once about its code tool; where no sandbox works here, raises
    UnconfinedError unless `accept_unconfined`, and otherwise lets this process's tool workers
    (started after this) run unconfined."""
    status = sandbox_status()
    if status.confined:
        return (f"code tool: confined (its own root and user, mount, network and PID "
                f"namespaces); the program sees /{', /'.join(status.view)} only")
    if not accept_unconfined:
        raise UnconfinedError(_refusal(status.reason))
    os.environ[UNCONFINED_ENV] = "1"
    return (f"code tool: UNCONFINED ({status.reason}): the model's code can read every file "
            f"this user can (agent.code_tool.unconfined: true)")
