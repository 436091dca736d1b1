"""The code tool's sandbox, host side: what the model's program may see, and whether it can be
built here.

The child (hone/agents/code_root.py, run inside code_child.py) gets a root of its own: a small
tmpfs in a new mount namespace, into which the host's files are bind-mounted one by one, then
`pivot_root` into it, with the old root detached. This module plans that root once per process
(`root_plan`), as a JSON-safe dict the child executes:

- `/python/lib/pythonX.Y`: the standard library (and its `lib-dynload` extension modules),
  read-only, with its `site-packages` masked by an empty read-only tmpfs; the interpreter is the
  one already running (its own libraries are loaded before the root changes), so no executable
  is mounted and nothing in the root can be run;
- the shared libraries that the extension modules load (found with `ldd` once per process),
  read-only, each file at its own path, with the symbolic links on the way to it (`/lib` ->
  `usr/lib` on a merged-/usr system) recreated; `/etc/ld.so.cache` so that the loader finds them;
- `/etc/passwd` and `/etc/group`: one-line stubs written in the root, nothing of the host's;
- `/dev/null`, `/dev/zero`, `/dev/urandom` (the host's devices, bound) and `/dev/fd`,
  `/dev/stdin`, `/dev/stdout`, `/dev/stderr` (links into /proc/self);
- `/sandbox`: the run's private folder, read-write (the working directory and HOME);
- `/tmp`: a private tmpfs of `CodeLimits.tmp_mb`;
- `/proc`: a fresh procfs of the run's PID namespace (the host's processes are not in it).

Nothing else: no home folder, no project, no data, no checkpoints, no host /etc. Libraries under
the interpreter's own prefix (libpython) are already loaded and are not mounted, which keeps
the prefix's folders (often in a home folder: pyenv) out of the view.

`hone.agents.code_tool.sandbox_status()` builds the plan and runs `PROBE` in it (once per process,
about a tool call's time): the tool runs confined only where that probe saw exactly the planned
view.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import sysconfig

# Namespaces of a confined run: user (root inside, the host's user outside), mount (its own
# root), network (no interface up), PID (the host's processes invisible; all die with its
# first), IPC (no System V objects of the host) and UTS (its own host name).
UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--net", "--pid", "--ipc", "--uts",
           "--fork", "--kill-child"]
PYTHON = f"/python/lib/python{sys.version_info[0]}.{sys.version_info[1]}"  # the stdlib inside
WORK = "/sandbox"  # the private folder inside
DEVICES = ("/dev/null", "/dev/zero", "/dev/urandom")
DEV_LINKS = {"/dev/fd": "/proc/self/fd", "/dev/stdin": "/proc/self/fd/0",
             "/dev/stdout": "/proc/self/fd/1", "/dev/stderr": "/proc/self/fd/2"}
STUBS = {"/etc/passwd": "root:x:0:0:sandbox:/sandbox:/nonexistent\n",
         "/etc/group": "root:x:0:\n"}
# Extension modules whose libraries are not mounted: tkinter needs a display (and X11's
# libraries), which a sandbox never has.
SKIPPED_MODULES = ("_tkinter",)


class _Plan:
    """Collects directories, links and binds of the root (paths inside it)."""

    def __init__(self):
        self.dirs: set[str] = set()
        self.links: dict[str, str] = {}
        self.binds: list[tuple[str, str, bool]] = []  # (host source, inside, is a folder)

    def mirror(self, path: str, depth: int = 0) -> None:
        """Mount host file `path` at the same path, recreating the links on the way to it."""
        if depth > 16:
            raise OSError(f"too many symbolic links on the way to {path}")
        parts = [p for p in path.split("/") if p]
        current = "/"
        for i, name in enumerate(parts):
            step = os.path.join(current, name)
            if os.path.islink(step):
                target = os.readlink(step)
                self.links[step] = target
                resolved = os.path.normpath(os.path.join(current, target))
                self.mirror(os.path.join(resolved, *parts[i + 1:]), depth + 1)
                return
            if i == len(parts) - 1:
                if (step, step, False) not in self.binds:
                    self.binds.append((step, step, False))
                return
            self.dirs.add(step)
            current = step


def _stdlib() -> tuple[str, str | None]:
    """The standard library's folder and, where it is elsewhere, lib-dynload's."""
    stdlib = os.path.realpath(sysconfig.get_path("stdlib"))
    dynload = os.path.realpath(os.path.join(sysconfig.get_path("platstdlib"), "lib-dynload"))
    inside = dynload == stdlib or dynload.startswith(stdlib + os.sep)
    return stdlib, (None if inside or not os.path.isdir(dynload) else dynload)


def _shared_libraries(folders: list[str]) -> list[str]:
    """The libraries the extension modules in `folders` load (ldd's `=> /path` lines), less
    those under the interpreter's prefix (already loaded: libpython)."""
    modules = sorted(os.path.join(d, f) for d in folders for f in os.listdir(d)
                     if f.endswith(".so") and not f.startswith(SKIPPED_MODULES))
    if shutil.which("ldd") is None:
        raise OSError("ldd is not installed: the libraries of the extension modules are unknown")
    out = subprocess.run(["ldd", *modules], capture_output=True, text=True, timeout=60).stdout
    prefix = os.path.realpath(sys.base_prefix) + os.sep
    found = []
    for line in out.splitlines():
        _, arrow, rest = line.partition("=> ")
        path = rest.split(" (", 1)[0].strip()
        if arrow and path.startswith("/") and path not in found and not (
                os.path.realpath(path).startswith(prefix)):
            found.append(path)
    return found


@functools.lru_cache(maxsize=1)
def root_plan() -> dict:
    """The root every confined run gets (module docstring), less its private folder."""
    stdlib, dynload = _stdlib()
    plan = _Plan()
    plan.binds.append((stdlib, PYTHON, True))
    translate = [[stdlib, PYTHON]]
    dynload_dirs = [os.path.join(stdlib, "lib-dynload")]
    if dynload is not None:
        plan.binds.append((dynload, PYTHON + "-dynload", True))
        translate.append([dynload, PYTHON + "-dynload"])
        dynload_dirs = [dynload]
    for lib in _shared_libraries([d for d in dynload_dirs if os.path.isdir(d)]):
        plan.mirror(lib)
    if os.path.isfile("/etc/ld.so.cache"):
        plan.mirror("/etc/ld.so.cache")
    masks = [PYTHON + "/site-packages"] if os.path.isdir(
        os.path.join(stdlib, "site-packages")) else []
    return {"dirs": sorted(plan.dirs), "links": plan.links, "binds": plan.binds,
            "masks": masks, "stubs": STUBS, "devices": list(DEVICES), "dev_links": DEV_LINKS,
            "translate": translate}


def planned_view(plan: dict) -> tuple[str, ...]:
    """The top-level names of the root `plan` builds."""
    paths = [*plan["dirs"], *plan["links"], *(b[1] for b in plan["binds"]), *plan["stubs"],
             *plan["devices"], WORK, "/tmp", "/proc"]
    return tuple(sorted({p.split("/")[1] for p in paths}))


def run_plan(plan: dict, folder: str, mountpoint: str, tmp_mb: int) -> dict:
    """`plan` completed for one run: its private folder and the root's mount point."""
    return {**plan, "binds": [*plan["binds"], (folder, WORK, True)], "writable": [WORK],
            "mountpoint": mountpoint, "tmp_mb": tmp_mb, "work": WORK}


def unavailable_reason() -> str | None:
    """Why no sandbox can be tried here at all (before any probe), or None."""
    if sys.platform != "linux":
        return f"mount and user namespaces are Linux's; this is {sys.platform}"
    if shutil.which("unshare") is None:
        return "`unshare` (util-linux) is not installed"
    return None


PROBE = "import os\nprint(' '.join(sorted(os.listdir('/'))))"  # what the status probe runs
