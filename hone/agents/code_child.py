"""The child side of the code tool (hone/agents/code_tool.py): run as a script, never imported.

    python -I -u code_child.py CONFIG_JSON      (cwd: the run's private folder)

It imports only the standard library and forks once:

- The supervisor (this process, PID 1 of the run's PID namespace when there is one) stays trusted:
  it sets no limits on itself, reaps what is orphaned inside the namespace, writes the snippet's
  exit status and CPU time to the status pipe as one JSON line, and exits; in a PID namespace its
  exit makes the kernel kill every process left there. An alarm a little past the wall limit kills
  the process group even when the host is gone.
- The runner (its child) lowers its resource limits (soft = hard, so the snippet cannot raise them
  again), installs an audit hook, and executes `snippet.py` as `__main__`.
- Confined (the config has a `root` plan: hone/agents/code_sandbox.py), the supervisor first
  builds the run's own root and moves into it (hone/agents/code_root.py, loaded by path), and
  the runner drops every capability before the program runs: the program sees only the planned
  files, whatever it does.

The audit hook (`sys.addaudithook`) refuses from Python code: starting processes (fork, exec,
spawn, os.system, subprocess), signals (os.kill, os.killpg, signal.pthread_kill), sockets, ctypes
and the low-level modules that bypass these events, changing resource limits, and writing,
creating, renaming, removing or changing files outside the private folder. It is a guard against
mistakes and against ordinary hostile Python, not a security boundary: a snippet can patch the
modules the hook calls, or reach code the events do not cover. The hard limits are the rlimits,
the namespaces and the host's kill of the whole process group.
"""

import json
import os
import resource
import signal
import sys
import traceback
import types

SNIPPET = "snippet.py"  # the code, written by the host into the private folder
ROOT_CODE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "code_root.py")

# Audit events refused outright (Python 3.11 names; see the "Audit events table" of the docs).
BLOCKED = frozenset({
    "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn", "os.system",
    "subprocess.Popen", "pty.spawn",
    "os.kill", "os.killpg", "signal.pthread_kill",
    "socket.__new__", "socket.bind", "socket.connect", "socket.getaddrinfo",
    "socket.gethostbyname", "socket.gethostbyaddr", "socket.sendto", "socket.sendmsg",
    "ctypes.dlsym", "ctypes.dlsym/handle", "ctypes.call_function", "ctypes.cdata",
    "ctypes.string_at", "ctypes.wstring_at",
    "resource.setrlimit", "resource.prlimit",
    "sqlite3.enable_load_extension", "sqlite3.load_extension",
    "gc.get_objects", "gc.get_referrers", "gc.get_referents",  # ways to reach the hook itself
})
# Modules that start processes or reach memory without raising the events above. ctypes itself
# may be imported (numpy does): it opens no library but the process's own (dlopen(None)), and
# looking up, calling or reading through it are refused above.
BLOCKED_IMPORTS = frozenset({"_posixsubprocess", "_xxsubinterpreters", "_testcapi",
                             "_testinternalcapi"})
# Events whose listed arguments are paths the snippet changes: allowed inside the folder only.
PATH_EVENTS = {
    "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,), "os.rename": (0, 1),
    "os.link": (0, 1), "os.symlink": (1,), "os.chmod": (0,), "os.chown": (0,),
    "os.truncate": (0,), "os.utime": (0,), "os.chflags": (0,), "os.lchflags": (0,),
    "os.setxattr": (0,), "os.removexattr": (0,), "shutil.rmtree": (0,), "sqlite3.connect": (0,),
}
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
DEVICES = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})  # writable outside the folder


def make_hook(roots: tuple):
    """The audit hook for a run that may write in `roots` (real paths): its private folder, and
    its private /tmp when confined."""
    # Everything the hook reads is bound here, in its closure: the snippet can reach this
    # module's globals (through frames), and rebinding them must not change the hook.
    blocked, blocked_imports, path_events = BLOCKED, BLOCKED_IMPORTS, dict(PATH_EVENTS)
    write_flags, devices, sep = WRITE_FLAGS, DEVICES, os.sep
    realpath, isdir, fspath = os.path.realpath, os.path.isdir, os.fspath

    def inside(path) -> bool:
        if isinstance(path, int):  # an open descriptor: opened (and checked) before
            return True
        path = fspath(path)
        path = path.decode(errors="surrogateescape") if isinstance(path, bytes) else path
        if path in devices or path == ":memory:":
            return True
        real = realpath(path)
        return any(real == root or real.startswith(root + sep) for root in roots)

    def hook(event: str, args: tuple) -> None:
        if event in blocked:
            raise PermissionError(f"{event} is not allowed in the code tool")
        if event == "import" and args[0] in blocked_imports:
            raise PermissionError(f"importing {args[0]} is not allowed in the code tool")
        if event == "ctypes.dlopen" and args[0] is not None:
            raise PermissionError("loading native libraries is not allowed in the code tool")
        if event == "open":
            path, mode, flags = args
            writes = (any(c in mode for c in "wax+") if isinstance(mode, str)
                      else bool(flags & write_flags))
            # A directory outside could serve as dir_fd for a relative open the hook cannot see.
            if (writes or (not isinstance(path, int) and isdir(path))) and not inside(path):
                raise PermissionError(f"the code tool may write only inside its folder, not "
                                      f"{path!r}")
        elif event in path_events:
            for i in path_events[event]:
                if i < len(args) and args[i] is not None and not inside(args[i]):
                    raise PermissionError(f"{event} outside the code tool's folder: {args[i]!r}")

    return hook


def user_tasks(uid: int) -> int:
    """Threads of every process of `uid` that this /proc shows: what RLIMIT_NPROC counts."""
    total = 0
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            if int(fields["Uid"].split()[0]) == uid:
                total += int(fields["Threads"])
        except (OSError, ValueError, KeyError):  # not a process, or it just ended
            continue
    return total


def set_limits(cfg: dict) -> None:
    """Lower every limit of this process (and so of what it starts); soft = hard."""
    mb = 1 << 20
    cpu = max(1, int(-(-cfg["cpu_s"] // 1)))  # whole seconds, rounded up
    limits = {
        resource.RLIMIT_CPU: (cpu, cpu + 1),  # SIGXCPU at the soft limit, SIGKILL one s later
        resource.RLIMIT_AS: (cfg["memory_mb"] * mb,) * 2,
        resource.RLIMIT_FSIZE: (cfg["file_mb"] * mb,) * 2,
        resource.RLIMIT_NOFILE: (cfg["open_files"],) * 2,
        resource.RLIMIT_CORE: (0, 0),
    }
    # RLIMIT_NPROC counts all tasks of the user (of its user namespace: in a fresh one only the
    # supervisor and this process), so outside a namespace the limit is relative to the count now.
    base = 2 if cfg["namespaces"] else user_tasks(os.getuid())
    limits[resource.RLIMIT_NPROC] = (base + cfg["max_processes"],) * 2
    for which, (soft, hard) in limits.items():
        old_soft, old_hard = resource.getrlimit(which)
        if old_hard != resource.RLIM_INFINITY:
            hard = min(hard, old_hard)
        resource.setrlimit(which, (min(soft, hard), hard))


def load_root_code():
    """hone/agents/code_root.py as a module (this script imports nothing of hone by name)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("hone_code_root", ROOT_CODE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_snippet(cfg: dict, root: str, sandbox) -> None:
    """The runner: limits, no capabilities when confined, the hook, then the snippet as
    __main__. Never returns."""
    set_limits(cfg)
    translate = []
    if sandbox is not None:
        try:
            sandbox.confine(cfg["root"])
        except OSError as err:
            sys.stderr.write(f"the code tool's sandbox failed: {err}\n")
            os._exit(125)
        translate = cfg["root"]["translate"]
    with open(SNIPPET, encoding="utf-8") as f:
        source = f.read()
    try:
        code = compile(source, SNIPPET, "exec")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        traceback.print_exc(limit=0)
        os._exit(1)
    if cfg["audit_hook"]:
        sys.addaudithook(make_hook((root, "/tmp") if sandbox is not None else (root,)))
    main_module = types.ModuleType("__main__")  # the snippet's own __main__, not this script
    main_module.__file__ = SNIPPET
    sys.modules["__main__"] = main_module
    sys.argv = [SNIPPET]
    sys.path.insert(0, root)  # the snippet's own modules, written into its folder
    try:
        exec(code, main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as err:  # the snippet's exception, its traceback without our frames
        shown = traceback.TracebackException(type(err), err, err.__traceback__,
                                             lookup_lines=False)
        frames = [f for f in shown.stack if f.filename != __file__]
        for frame in frames:  # the standard library's frames by their paths inside the root
            if translate and (there := sandbox.inside(frame.filename, translate)):
                frame.filename = there
        shown.stack = traceback.StackSummary.from_list(frames)
        sys.stderr.write("".join(shown.format()))
        sys.stderr.flush()
        raise SystemExit(1) from None
    raise SystemExit(0)


def supervise(pid: int, cfg: dict, status_fd: int) -> None:
    """Wait for the runner (reaping orphans meanwhile), report its status, and exit."""

    def out_of_time(signum, frame):  # the host should have killed us already: it may be gone
        try:
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(137)

    signal.signal(signal.SIGALRM, out_of_time)
    signal.alarm(int(cfg["wall_s"]) + 3)
    while True:
        try:
            done, status, usage = os.wait4(-1, 0)
        except ChildProcessError:
            status, usage = 0, None
            break
        if done == pid:
            break
    report = {"cpu_s": usage.ru_utime + usage.ru_stime if usage else 0.0}
    if os.WIFSIGNALED(status):
        report["signal"] = os.WTERMSIG(status)
    else:
        report["exit"] = os.waitstatus_to_exitcode(status)
    os.write(status_fd, (json.dumps(report) + "\n").encode())
    os._exit(0)


def main() -> None:
    cfg = json.loads(sys.argv[1])
    sandbox = None
    if cfg.get("root"):
        sandbox = load_root_code()
        try:
            sandbox.enter(cfg["root"])
        except OSError as err:
            sys.stderr.write(f"the code tool's sandbox could not be built: {err}\n")
            os._exit(125)
    root = os.path.realpath(os.getcwd())
    pid = os.fork()
    if pid == 0:
        os.close(cfg["status_fd"])
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        run_snippet(cfg, root, sandbox)
    supervise(pid, cfg, cfg["status_fd"])


if __name__ == "__main__":
    main()
