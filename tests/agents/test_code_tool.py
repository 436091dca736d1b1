"""The code tool: ordinary programs give their output and exit code; hostile ones (fork bombs,
loops, memory hogs, floods, writes outside the folder, network, processes, signals at the host)
end with the host process, its process group, its files and its network untouched, no process
left behind and the private folder gone.

Each hostile snippet runs under every layer setup the machine allows: the sandbox and the audit
hook (the default), the audit hook alone (no sandbox), and the sandbox alone (the hard layers
without the in-child guard); tests/agents/test_code_sandbox.py tries what the sandbox hides. The control tests run the same snippets with no guard at all, to
show that the checks here do see a write or a connection when one gets through; the limits that
need neither namespaces nor the hook (CPU, memory, output, processes) are also run with neither.
"""

import dataclasses
import os
import socket
import time

import pytest
from code_host import AUDITED, HARD, MARK, MODES, SMALL, UNGUARDED

from hone.agents.code_tool import CodeLimits, format_result, run_code, run_python
from hone.agents.environment import ToolEnvironment
from hone.agents.tool_runner import ToolRunner
from hone.agents.tools import tool_schema


# ---- ordinary programs ------------------------------------------------------------------------

def test_output_exit_code_and_errors(host):
    result = run_code("import sys\nprint('hello')\nprint('oops', file=sys.stderr)\nsys.exit(3)",
                      CodeLimits(**SMALL))
    assert (result.exit_code, result.stdout, result.stderr) == (3, "hello\n", "oops\n")
    assert result.killed is None and not result.output_cut
    result = run_code("def f():\n    return 1 / 0\nf()", CodeLimits(**SMALL))
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("Traceback") and "ZeroDivisionError" in result.stderr
    assert 'File "snippet.py", line 2, in f' in result.stderr
    assert "code_child" not in result.stderr  # the tool's own frames are not shown
    result = run_code("print(", CodeLimits(**SMALL))
    assert result.exit_code == 1 and "SyntaxError" in result.stderr


def test_files_inside_the_folder_and_the_standard_library(host):
    code = ("import json, os, tempfile\n"
            "open('out.txt', 'w').write('inside')\n"
            "os.makedirs('a/b')\n"
            "with tempfile.NamedTemporaryFile('w', delete=False) as f:\n"
            "    f.write('tmp')\n"
            "os.chmod('a/b', 0)\n"
            "os.chmod('a', 0)  # the host still removes the folder\n"
            "print(json.dumps([open('out.txt').read(), os.environ['HOME'] == os.getcwd()]))\n")
    result = run_code(code, CodeLimits(**SMALL))
    assert (result.exit_code, result.stdout, result.stderr) == (0, '["inside", true]\n', "")


def test_format_result():
    limits = CodeLimits(**{**SMALL, "wall_s": 0.5})
    text = format_result(run_code("print(6 * 7)", limits), limits)
    assert text == "exit code 0\nstdout:\n42"
    text = format_result(run_code("import time\ntime.sleep(60)", limits), limits)
    assert text == "killed: it reached the wall-clock limit of 0.5 s"


def test_run_python_is_a_tool_of_a_tool_environment(host):
    schema = tool_schema(run_python)["function"]
    assert schema["name"] == "run_python" and schema["parameters"]["required"] == ["code"]
    with ToolRunner(max_workers=1) as runner:
        env = ToolEnvironment([run_python], reward=lambda **kw: 1.0, runner=runner)
        env.reset({"prompt": "add"})
        step = env.step('<tool_call>\n{"name": "run_python", "arguments": {"code": '
                        '"print(sum(range(10)))"}}\n</tool_call>')
    assert step.messages == [{"role": "tool", "name": "run_python",
                              "content": "exit code 0\nstdout:\n45"}]
    assert step.info == {"tool_calls": 1}


# ---- hostile programs -------------------------------------------------------------------------

def patient(limits: CodeLimits) -> CodeLimits:
    """`limits` with room on the wall clock: a CPU-bound snippet on a busy machine still reaches
    its CPU limit first."""
    return dataclasses.replace(limits, wall_s=10.0)


FORK_BOMB = ("import os\n"
             "while True:\n"
             "    try:\n"
             "        os.fork()\n"
             "    except OSError:\n"
             "        pass\n")


@pytest.mark.parametrize("limits", HARD.values(), ids=HARD.keys())
def test_fork_bomb(host, limits):
    result = run_code(FORK_BOMB, patient(limits))
    assert result.killed in ("cpu_s", "max_processes"), result


@pytest.mark.parametrize("limits", HARD.values(), ids=HARD.keys())
def test_infinite_loop_and_sleep(host, limits):
    assert run_code("while True:\n    pass", patient(limits)).killed == "cpu_s"
    result = run_code("import time\nprint('started')\ntime.sleep(1000)", limits)
    assert (result.killed, result.exit_code, result.stdout) == ("wall_s", None, "started\n")


@pytest.mark.parametrize("limits", HARD.values(), ids=HARD.keys())
def test_memory_hog(host, limits):
    result = run_code("chunks = []\nwhile True:\n    chunks.append(bytearray(10**7))", limits)
    assert result.exit_code == 1 and "MemoryError" in result.stderr, result
    result = run_code("x = bytearray(10**10)", limits)
    assert result.exit_code == 1 and "MemoryError" in result.stderr, result


@pytest.mark.parametrize("limits", HARD.values(), ids=HARD.keys())
def test_huge_output(host, limits):
    for code in ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)",
                 "print('y' * 10**7)",
                 "import sys\nwhile True:\n    print('z', file=sys.stderr)"):
        result = run_code(code, limits)
        assert result.killed == "output_bytes" and result.output_cut, result
        assert 0 < len(result.stdout) + len(result.stderr) <= limits.output_bytes
    result = run_code("open('big', 'w').write('x' * 2 * 2**20)", limits)  # past file_mb
    assert result.exit_code == 1 and 'File too large' in result.stderr, result


def writes_outside(outside: str) -> str:
    """A snippet that tries every way it has to change `outside`, printing what worked."""
    return f"""
import os, pathlib, shutil
outside = {outside!r}
worked = []
def attempt(name, fn):
    try:
        fn()
        worked.append(name)
    except Exception:
        pass
attempt("open", lambda: open(os.path.join(outside, "keep.txt"), "w").write("changed"))
attempt("append", lambda: open(os.path.join(outside, "keep.txt"), "a").write("more"))
attempt("os.open", lambda: os.write(os.open(os.path.join(outside, "new"),
                                           os.O_WRONLY | os.O_CREAT), b"x"))
attempt("pathlib", lambda: pathlib.Path(outside, "new2").write_text("x"))
attempt("remove", lambda: os.remove(os.path.join(outside, "keep.txt")))
attempt("rename", lambda: os.rename(os.path.join(outside, "keep.txt"),
                                     os.path.join(outside, "moved")))
attempt("mkdir", lambda: os.mkdir(os.path.join(outside, "dir")))
attempt("chmod", lambda: os.chmod(os.path.join(outside, "keep.txt"), 0))
attempt("rmtree", lambda: shutil.rmtree(outside))
attempt("move in", lambda: shutil.move(os.path.join(outside, "keep.txt"), "stolen.txt"))
os.symlink(outside, "link")
attempt("symlink", lambda: open("link/via_link", "w").write("x"))
attempt("relative", lambda: open("../" * 30 + outside.lstrip("/") + "/rel", "w").write("x"))
print(worked)
"""


@pytest.mark.parametrize("limits", MODES.values(), ids=MODES.keys())
def test_writes_outside_the_folder(host, limits):
    result = run_code(writes_outside(host["outside"]), limits)
    assert (result.exit_code, result.stdout) == (0, "[]\n"), result


def test_writes_outside_are_seen_without_a_guard(host):
    """Control: with no guard the snippet does change the folder, and the checks see it."""
    result = run_code(writes_outside(host["outside"]), UNGUARDED)
    assert result.exit_code == 0 and "'open'" in result.stdout and "'mkdir'" in result.stdout
    assert "'rmtree'" in result.stdout and not os.path.exists(host["outside"])
    os.makedirs(host["outside"])  # put it back, so that the fixture's checks pass
    with open(os.path.join(host["outside"], "keep.txt"), "w") as f:
        f.write("original")


def connect_to(port: int) -> str:
    return (f"import socket\ns = socket.socket()\ns.settimeout(1)\n"
            f"print(s.connect_ex(('127.0.0.1', {port})))")


@pytest.fixture
def server():
    """A listening socket of the host; the test checks that nobody connected."""
    try:
        s = socket.create_server(("127.0.0.1", 0))
    except OSError as err:  # a machine without IPv4
        pytest.skip(f"no IPv4 loopback here: {err}")
    with s:
        s.setblocking(False)
        yield s


def accepted(server) -> bool:
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


@pytest.mark.parametrize("limits", MODES.values(), ids=MODES.keys())
def test_network(host, server, limits):
    result = run_code(connect_to(server.getsockname()[1]), limits)
    assert result.stdout != "0\n", result  # connect_ex gives 0 on a connection
    assert not accepted(server)
    if limits.audit_hook:
        assert "PermissionError: socket.__new__" in result.stderr


def test_network_is_seen_without_a_guard(server):
    """Control: with no guard the connection is made, and the check sees it."""
    result = run_code(connect_to(server.getsockname()[1]), UNGUARDED)
    assert result.stdout == "0\n", result
    time.sleep(0.1)
    assert accepted(server)


@pytest.mark.parametrize("limits", AUDITED.values(), ids=AUDITED.keys())
def test_processes_are_refused(host, limits):
    for code in (f"import os\nos.system('sleep {MARK} &')",
                 "import subprocess\nsubprocess.run(['true'])",
                 f"import os\nos.execv('/bin/sleep', ['sleep', '{MARK}'])",
                 f"import os\nos.posix_spawn('/bin/sleep', ['sleep', '{MARK}'], {{}})",
                 "import multiprocessing\nmultiprocessing.Process(target=print).start()",
                 "import _posixsubprocess",
                 "import ctypes\nctypes.CDLL('libc.so.6')",
                 "import ctypes\nctypes.pythonapi.Py_Exit(0)"):
        result = run_code(code, limits)
        assert result.exit_code == 1 and "PermissionError" in result.stderr, (code, result)


@pytest.mark.parametrize("limits", MODES.values(), ids=MODES.keys())
def test_processes_left_behind_are_killed(host, limits):
    """Background processes, and one that leaves the session, are gone when the run ends (the
    fixture looks for them); under the audit hook they are never started."""
    escape = ("import os, time\n"
              "if os.fork() == 0:\n"
              "    os.setsid()\n"
              "    time.sleep(1000)\n"
              f"os.system('sleep {MARK} &')\n"
              "print('parent done')")
    result = run_code(escape, limits)
    assert result.exit_code == (1 if limits.audit_hook else 0), result


@pytest.mark.parametrize("limits", MODES.values(), ids=MODES.keys())
def test_signals_at_the_host(host, limits):
    code = (f"import os, signal, threading\n"
            f"for fn in (lambda: os.kill({host['pid']}, signal.SIGUSR1),\n"
            f"           lambda: os.killpg({host['pgid']}, signal.SIGUSR1),\n"
            f"           lambda: os.kill(os.getppid(), signal.SIGKILL),\n"
            f"           lambda: signal.pthread_kill(threading.get_ident(), 0)):\n"
            f"    try:\n"
            f"        fn()\n"
            f"    except Exception as err:\n"
            f"        print(type(err).__name__)\n")
    result = run_code(code, limits)
    assert result.killed is None, result  # the supervisor (its parent) ignores the SIGKILL
    if limits.audit_hook:
        assert result.stdout.split() == ["PermissionError"] * 4, result
    # Its own process group: the run dies, the host does not.
    result = run_code("import os, signal\nos.killpg(0, signal.SIGKILL)", limits)
    assert result.exit_code == (1 if limits.audit_hook else None), result
