"""The Python code tool: the model's code runs in a fresh, limited child process.

`run_python(code)` is a tool like the calculator (type hints and a docstring, so `tool_schema`
describes it and `ToolEnvironment(tools=[run_python])` runs it in a ToolRunner worker);
`run_code(code, CodeLimits(...))` is the same with chosen limits and a structured result.

Design choices:

- One run, one process tree: a fresh interpreter (`python -I -u`, the host's executable) in a new
  session, with a minimal environment (no proxies; HOME and TMPDIR are the run's private folder,
  which is also its working directory and is removed afterwards), stdin closed.
- Layers. Hard, enforced by the kernel or this process: resource limits (CPU seconds, address
  space, file size, open files, processes, no core files), the wall clock and the output cap
  (the host kills the whole process group and sweeps the session), and, where unprivileged user
  namespaces work (`unshare`), a network namespace with no interfaces up and a PID namespace, in
  which the host is invisible and whose processes all die with its first one. Soft: an audit
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

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_child.py")
UNSHARE = ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child"]
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
    namespaces: Literal["auto", "require", "off"] = "auto"  # user+net+pid namespaces via unshare
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
    namespaces: bool  # it ran in its own user, network and PID namespaces


@functools.lru_cache(maxsize=1)
def namespaces_available() -> bool:
    """Whether `unshare` can make unprivileged user, network and PID namespaces here."""
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run(UNSHARE + ["true"], stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
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
    """Run Python `code` in a fresh limited process; every outcome is a CodeResult."""
    if limits.namespaces == "off":
        use_ns = False
    else:
        use_ns = namespaces_available()
        if limits.namespaces == "require" and not use_ns:
            raise RuntimeError("the code tool requires user namespaces and `unshare --user "
                               "--net --pid` does not work here")
    folder = tempfile.mkdtemp(prefix="hone-code-")
    try:
        with open(os.path.join(folder, "snippet.py"), "w", encoding="utf-8") as f:
            f.write(code)
        return _run_in(folder, limits, use_ns)
    finally:
        _remove(folder)


def _run_in(folder: str, limits: CodeLimits, use_ns: bool) -> CodeResult:
    status_r, status_w = os.pipe()
    cfg = {"status_fd": status_w, "wall_s": limits.wall_s, "cpu_s": limits.cpu_s,
           "memory_mb": limits.memory_mb, "file_mb": limits.file_mb,
           "open_files": limits.open_files, "max_processes": limits.max_processes,
           "namespaces": use_ns, "audit_hook": limits.audit_hook}
    argv = [sys.executable, "-I", "-u", CHILD, json.dumps(cfg)]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": folder, "TMPDIR": folder,
           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    try:
        proc = subprocess.Popen(UNSHARE + argv if use_ns else argv, cwd=folder, env=env,
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
                      killed, cut, use_ns)


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
