"""The code tool's sandbox: what a confined program can see of the host (nothing but the planned
root), and what happens where no sandbox can be built (a refusal unless accepted).

Every hostile read runs confined with and without the audit hook (the hook does not guard reads;
the sandbox alone must hide them), and once more unconfined as a control: there the same
program does read the host's files, so the checks here can fail.
"""

import json
import os
import sys

import pytest
from code_host import CONFINED, SANDBOXED, SMALL

from hone.agents import code_sandbox, code_tool
from hone.agents.code_sandbox import PYTHON
from hone.agents.code_tool import (CodeLimits, SandboxStatus, UnconfinedError, run_code,
                                   sandbox_status)
from hone.agents.environment import ToolEnvironment
from hone.agents.tool_runner import InlineRunner

PROJECT_FILE = os.path.abspath(code_tool.__file__)
# Every top-level name a root may hold: /lib, /lib64 and the like only where the host's
# libraries sit behind such links (merged /usr).
ALLOWED_TOP = {"dev", "etc", "proc", "python", "sandbox", "tmp", "usr", "lib", "lib32", "lib64",
               "libx32"}


def hostile_reads(targets: dict, harmful: bool = True) -> str:
    """A program that tries to read each of `targets` (name -> a path) and more, and prints, as
    JSON, the attempts that worked with what they got. `harmful`: also ptrace the host, mount
    and chroot (not in the unconfined control, where they would stop or change the host)."""
    return f"""
import ctypes, json, os
targets = {targets!r}
got = {{}}
def attempt(name, fn):
    try:
        value = fn()
    except Exception as err:
        return
    got[name] = str(value)[:60]
def read(path):
    with open(path, 'rb') as f:
        return f.read(200)
for name, path in targets.items():
    attempt(name, lambda: os.listdir(path) if os.path.isdir(path) else read(path))
attempt('.. out', lambda: read('../' * 30 + 'etc/shadow'))
os.symlink(targets['data file'], 'to_data')
attempt('symlink out', lambda: read('to_data'))
attempt('symlink to /', lambda: os.listdir(os.path.join(os.readlink('/proc/1/root'), 'root')))
attempt('hard link', lambda: os.link(targets['data file'], 'linked') or read('linked'))
attempt('hard link lib', lambda: os.link('{PYTHON}/os.py', 'os_link') or 'linked')
attempt('proc 1 environ', lambda: read('/proc/1/environ'))
attempt('proc 1 root', lambda: os.listdir('/proc/1/root'))
attempt('proc 1 mem', lambda: read('/proc/1/mem'))
attempt('mknod', lambda: os.mknod('mem', 0o20600, os.makedev(1, 1)) or read('mem'))
attempt('write stdlib', lambda: open('{PYTHON}/os.py', 'a').write('#'))
libc = ctypes.CDLL(None, use_errno=True)
if not {harmful!r}:
    print(json.dumps(got))
    raise SystemExit(0)
attempt('ptrace 1', lambda: libc.ptrace(16, 1, 0, 0) == 0 or 1 / 0)
attempt('ptrace host', lambda: libc.ptrace(16, {os.getpid()}, 0, 0) == 0 or 1 / 0)
attempt('umount', lambda: libc.umount2(b'{PYTHON}', 2) == 0 or 1 / 0)
attempt('remount rw', lambda: libc.mount(None, b'{PYTHON}', None, 32 | 4096, None) == 0 or 1 / 0)
attempt('mount host', lambda: libc.mount(b'/dev/vda', b'/tmp', b'ext4', 0, None) == 0 or 1 / 0)
attempt('chroot', lambda: os.chroot('/tmp') or os.listdir('/'))
print(json.dumps(got))
"""


@pytest.fixture
def secrets(tmp_path):
    """Host paths a program must not read: the host's credentials and home folders, the
    project's own source, a run folder with its checkpoint and metrics, the data file, the
    test process's /proc, devices beyond the three."""
    run = tmp_path / "run"
    (run / "checkpoints" / "10").mkdir(parents=True)
    (run / "checkpoints" / "10" / "state").write_text("weights")
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    data = tmp_path / "data.jsonl"
    data.write_text('{"prompt": "2+2", "answer": "4"}\n')
    return {"shadow": "/etc/shadow", "hostname": "/etc/hostname", "root home": "/root",
            "home": "/home", "project": PROJECT_FILE, "project folder": os.path.dirname(
                PROJECT_FILE), "run folder": str(run), "checkpoint": str(
                run / "checkpoints" / "10" / "state"), "data file": str(data),
            "host proc": f"/proc/{os.getpid()}/environ", "host cmdline":
                f"/proc/{os.getppid()}/cmdline", "disk": "/dev/vda", "dev mem": "/dev/mem",
            "kmsg": "/dev/kmsg", "sys": "/sys/kernel", "interpreter": sys.executable,
            "site-packages": f"{PYTHON}/site-packages/pip", "host stdlib": os.__file__}


@pytest.mark.parametrize("limits", SANDBOXED.values(), ids=SANDBOXED.keys())
def test_hostile_reads_fail(host, secrets, limits):
    result = run_code(hostile_reads(secrets), limits)
    assert result.exit_code == 0 and result.sandboxed, result
    assert json.loads(result.stdout) == {}


def test_hostile_reads_are_seen_unconfined(host, secrets):
    """Control: unconfined (and without the hook, which would refuse ctypes) the same program
    reads the host's files, so an empty report above means the sandbox hid them."""
    limits = CodeLimits(**SMALL, sandbox="off", audit_hook=False)
    got = json.loads(run_code(hostile_reads(secrets, harmful=False), limits).stdout)
    assert {"shadow", "root home", "project", "run folder", "data file", "symlink out",
            "hard link", "host proc", "interpreter"} <= set(got), got
    assert got["data file"] == str(b'{"prompt": "2+2", "answer": "4"}\n')


VIEW = """
import json, os
def files(top):
    return sorted(os.path.join(d, f) for d, _, fs in os.walk(top) for f in fs)
status = open('/proc/self/status').read().splitlines()
print(json.dumps({
    "top": sorted(os.listdir('/')), "etc": sorted(os.listdir('/etc')),
    "passwd": open('/etc/passwd').read(), "dev": sorted(os.listdir('/dev')),
    "libraries": len(files('/usr')),
    "not libraries": [p for p in files('/usr') if '.so' not in os.path.basename(p)],
    "site": os.listdir('/python/lib/%s/site-packages' % os.listdir('/python/lib')[0]),
    "pids": sorted(int(p) for p in os.listdir('/proc') if p.isdigit()),
    "env": dict(os.environ), "cwd": os.getcwd(), "home": os.path.expanduser('~'),
    "caps": [l for l in status if l.startswith(('Cap', 'NoNewPrivs'))],
    "tmp": os.statvfs('/tmp').f_blocks * os.statvfs('/tmp').f_frsize,
    "sandbox writable": open('x', 'w').write('x'), "tmp writable": open('/tmp/y', 'w').write('y'),
}))
"""


@pytest.mark.parametrize("limits", SANDBOXED.values(), ids=SANDBOXED.keys())
def test_the_view(host, limits):
    """The child sees exactly the allowed top-level names, stub /etc files, three devices,
    libraries only under /usr, its own processes, a fixed environment, no capability."""
    result = run_code(VIEW, limits)
    assert result.exit_code == 0, result
    seen = json.loads(result.stdout)
    assert seen["top"] == list(sandbox_status().view)
    assert {"dev", "etc", "proc", "python", "sandbox", "tmp"} <= set(seen["top"]) <= ALLOWED_TOP
    assert set(seen["etc"]) <= {"group", "ld.so.cache", "passwd"}
    assert seen["passwd"] == "root:x:0:0:sandbox:/sandbox:/nonexistent\n"
    assert seen["dev"] == ["fd", "null", "stderr", "stdin", "stdout", "urandom", "zero"]
    assert seen["libraries"] > 0 and seen["not libraries"] == []
    assert seen["site"] == []
    assert seen["pids"] == [1, 2]  # the supervisor and the runner: nothing of the host
    assert seen["env"] == {"PATH": "/usr/bin:/bin", "HOME": "/sandbox", "TMPDIR": "/tmp",
                           "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    assert seen["cwd"] == seen["home"] == "/sandbox"
    assert all(line.split()[-1] == "0000000000000000" for line in seen["caps"]
               if line.startswith("Cap")) and "NoNewPrivs:\t1" in seen["caps"]
    assert seen["tmp"] == limits.tmp_mb << 20


@CONFINED
def test_standard_library_and_tracebacks(host):
    """The whole standard library works inside (extension modules and their libraries), and
    a traceback through it shows its source at the paths inside."""
    code = ("import json, ssl, sqlite3, decimal, hashlib, zlib, lzma, bz2, ctypes, uuid, "
            "tempfile, pathlib, csv, datetime\n"
            "db = sqlite3.connect(':memory:')\n"
            "print(db.execute('select 6 * 7').fetchone()[0], hashlib.sha256(b'').hexdigest()[:8],"
            " len(lzma.compress(b'x')) > 0, ssl.OPENSSL_VERSION[:7])\n"
            "json.loads('{')")
    result = run_code(code, CodeLimits(**SMALL))
    assert result.stdout == "42 e3b0c442 True OpenSSL\n", result
    assert f'File "{PYTHON}/json/decoder.py"' in result.stderr, result.stderr
    assert "obj, end = self.scan_once(s, idx)" in result.stderr  # the source, read inside


# ---- where no sandbox can be built ------------------------------------------------------------

NOWHERE = SandboxStatus(False, "user namespaces are off (test)", ())


@pytest.fixture
def no_sandbox(monkeypatch):
    """No sandbox here; the acceptance variable unset, and unset again afterwards (a run that
    accepts an unconfined tool sets it)."""
    monkeypatch.setattr(code_tool, "sandbox_status", lambda: NOWHERE)
    monkeypatch.setenv(code_tool.UNCONFINED_ENV, "0")
    monkeypatch.delenv(code_tool.UNCONFINED_ENV)


def test_refuses_to_run_unconfined_unless_accepted(host, no_sandbox, monkeypatch):
    with pytest.raises(UnconfinedError, match="user namespaces are off.*agent.code_tool"):
        run_code("print(1)", CodeLimits(**SMALL))
    result = run_code("print(1)", CodeLimits(**SMALL, unconfined=True))
    assert (result.stdout, result.sandboxed) == ("1\n", False)
    with pytest.raises(UnconfinedError):  # "require" never runs unconfined
        run_code("print(1)", CodeLimits(**SMALL, sandbox="require", unconfined=True))
    monkeypatch.setenv(code_tool.UNCONFINED_ENV, "1")  # what a run's config sets for workers
    assert run_code("print(1)", CodeLimits(**SMALL)).stdout == "1\n"


def test_the_model_reads_the_refusal(no_sandbox):
    env = ToolEnvironment([code_tool.run_python], reward=lambda **kw: 1.0, runner=InlineRunner())
    env.reset({"prompt": "add"})
    step = env.step('<tool_call>\n{"name": "run_python", "arguments": {"code": "print(1)"}}\n'
                    '</tool_call>')
    assert step.messages[0]["content"].startswith("error: UnconfinedError: the code tool cannot "
                                                  "confine the program here")


def test_status_where_unshare_is_missing(monkeypatch):
    monkeypatch.setattr(code_sandbox.shutil, "which", lambda name: None)
    assert "`unshare` (util-linux) is not installed" in code_sandbox.unavailable_reason()


def code_tool_config(*overrides):
    from hone.config import load_config
    from hone.config.rl_schema import GRPOConfig
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return load_config(GRPOConfig, os.path.join(root, "configs/tiny/agent_grpo.yaml"), [
        "agent.environment=null", "agent.tools=[hone.agents.code_tool:run_python]",
        "grpo.max_prompt_tokens=224", *overrides])


def test_a_run_refuses_to_start_unless_accepted(no_sandbox, monkeypatch):
    from hone.agents.factory import environment_factory
    from hone.errors import InputError
    with pytest.raises(InputError, match="user namespaces are off") as err:
        environment_factory(code_tool_config(), log=lambda s: None)
    assert err.value.key == "agent.code_tool.unconfined"
    lines = []
    environment_factory(code_tool_config("agent.code_tool.unconfined=true"), log=lines.append)
    assert lines[0].startswith("agent: code tool: UNCONFINED (user namespaces are off (test))")
    assert os.environ[code_tool.UNCONFINED_ENV] == "1"  # for the run's tool workers


def test_a_run_and_the_doctor_say_what_the_program_sees(capsys):
    from hone.agents.factory import environment_factory
    from hone.cli import main
    lines = []
    environment_factory(code_tool_config(), log=lines.append)
    assert main(["doctor", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)["code_tool"]
    status = sandbox_status()
    assert report == {"confined": status.confined, "why_not": status.reason,
                      "view": list(status.view)}
    if status.confined:
        assert lines[0] == ("agent: code tool: confined (its own root and user, mount, network "
                            "and PID namespaces); the program sees /" + ", /".join(status.view)
                            + " only")
    assert main(["doctor"]) == 0
    assert "code tool: confined" in capsys.readouterr().out or not status.confined
