"""The code tool's sandbox, child side: builds the run's root and confines the runner.

Loaded by hone/agents/code_child.py by its path (the child imports nothing of hone), inside the
run's new user, mount and PID namespaces, where the child is root with every capability over
them (and none over the host's). hone/agents/code_sandbox.py plans the root; this file carries
the plan out with the kernel's calls (through ctypes: the standard library has no `mount`):

- `enter(plan)` (the supervisor, PID 1 of the run): a tmpfs for the new root; the planned
  folders, links and stub files in it; each planned host file or folder bind-mounted and made
  read-only (only the private folder stays writable; nothing may hold set-user-ID programs or
  device files but the three devices); masks, a private /tmp and a fresh /proc; `pivot_root`
  into it, the old root detached (so no path leads back to the host's files) and the new root
  itself read-only. The supervisor then makes itself non-dumpable, so the runner cannot ptrace
  it or read its memory through /proc.
- `confine(plan)` (the runner, before the program): every capability dropped for good (bounding
  set, ambient set, securebits locked so that exec gives none back, no_new_privs), so the
  program cannot unmount, remount read-write, mount anew or ptrace; the interpreter's paths
  moved to the ones inside (`sys.path`, the prefixes).

A bind mount keeps the flags of its source that a user namespace may not clear (nosuid, nodev,
noexec, the atime mode): the read-only remount repeats them, else the kernel refuses it.
"""

import ctypes
import os
import sys

MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC = 1, 2, 4, 8
MS_REMOUNT, MS_BIND, MS_REC, MS_PRIVATE = 32, 4096, 16384, 1 << 18
MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 1024, 2048, 1 << 21
MNT_DETACH = 2
LOCKED = ((os.ST_NOSUID, MS_NOSUID), (os.ST_NODEV, MS_NODEV), (os.ST_NOEXEC, MS_NOEXEC),
          (os.ST_NOATIME, MS_NOATIME), (os.ST_NODIRATIME, MS_NODIRATIME),
          (os.ST_RELATIME, MS_RELATIME))
PR_SET_DUMPABLE, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 4, 24, 28, 38
PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
# SECBIT_NOROOT, NO_SETUID_FIXUP, NO_CAP_AMBIENT_RAISE, each with its lock, and KEEP_CAPS locked
# off: an exec as uid 0 gives no capability back.
SECUREBITS = 0x01 | 0x02 | 0x04 | 0x08 | 0x20 | 0x40 | 0x80
CAPABILITY_V3 = 0x20080522

LIBC = ctypes.CDLL(None, use_errno=True)


def _call(name: str, *args) -> None:
    """libc's `name`(*args); a non-zero return raises OSError with errno and the call's name."""
    if getattr(LIBC, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}{tuple(a for a in args if isinstance(a, bytes))}: "
                           f"{os.strerror(err)}")


def _b(text):
    return None if text is None else os.fsencode(text)


def mount(source, target, fstype, flags: int, data=None) -> None:
    _call("mount", _b(source), _b(target), _b(fstype), ctypes.c_ulong(flags), _b(data))


def locked_flags(path: str) -> int:
    """The mount flags of `path`'s mount that a bind of it must keep."""
    have = os.statvfs(path).f_flag
    return sum(ms for st, ms in LOCKED if have & st)


def bind(source: str, target: str, writable: bool) -> None:
    """Bind `source` at `target` (which exists), read-only unless `writable`."""
    mount(source, target, None, MS_BIND)
    flags = MS_REMOUNT | MS_BIND | MS_NOSUID | MS_NODEV | locked_flags(source)
    mount(None, target, None, flags | (0 if writable else MS_RDONLY))


def _touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))


def enter(plan: dict) -> None:
    """Build the root of `plan` (code_sandbox.run_plan) and make it this process's root; the
    working directory is then the private folder. Raises OSError naming the call that failed."""
    new = plan["mountpoint"]
    mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host's mounts
    mount("tmpfs", new, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,nr_inodes=4096,mode=0755")
    for folder in plan["dirs"]:
        os.makedirs(new + folder, exist_ok=True)
    for link, target in plan["links"].items():
        os.makedirs(os.path.dirname(new + link), exist_ok=True)
        os.symlink(target, new + link)
    for path, text in plan["stubs"].items():
        _touch(new + path)
        with open(new + path, "w") as f:
            f.write(text)
    for source, target, is_dir in plan["binds"]:
        if is_dir:
            os.makedirs(new + target, exist_ok=True)
        else:
            _touch(new + target)
        bind(source, new + target, target in plan["writable"])
    for device in plan["devices"]:  # the devices themselves: no remount (they keep nodev off)
        _touch(new + device)
        mount(device, new + device, None, MS_BIND)
    for link, target in plan["dev_links"].items():
        os.symlink(target, new + link)
    for folder in plan["masks"]:
        mount("tmpfs", new + folder, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
              "size=4k,nr_inodes=16,mode=0555")
    os.makedirs(new + "/tmp")
    mount("tmpfs", new + "/tmp", "tmpfs", MS_NOSUID | MS_NODEV,
          f"size={int(plan['tmp_mb'])}m,mode=1777")
    os.makedirs(new + "/proc")
    mount("proc", new + "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(new)
    _call("pivot_root", b".", b".")  # the old root is now stacked under the new one:
    _call("umount2", b".", ctypes.c_int(MNT_DETACH))  # detached, it is unreachable
    os.chdir("/")
    mount(None, "/", None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV)
    _call("prctl", PR_SET_DUMPABLE, ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0),
          ctypes.c_ulong(0))
    os.chdir(plan["work"])


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32)]


def _prctl(option: int, arg: int = 0) -> int:
    """prctl(option, arg, 0, 0, 0); returns its result (the caller reads errno)."""
    z = ctypes.c_ulong(0)
    return LIBC.prctl(option, ctypes.c_ulong(arg), z, z, z)


def drop_capabilities() -> None:
    """Give up every capability, now and across exec, for good."""
    if _prctl(PR_SET_SECUREBITS, SECUREBITS) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECUREBITS)")
    for cap in range(64):
        if _prctl(PR_CAPBSET_DROP, cap) != 0:
            if ctypes.get_errno() == 22:  # EINVAL: past the last capability this kernel has
                break
            raise OSError(ctypes.get_errno(), f"prctl(PR_CAPBSET_DROP, {cap})")
    _prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL)  # EINVAL on kernels before 4.3: none
    header, data = _CapHeader(CAPABILITY_V3, 0), (_CapData * 2)()
    _call("capset", ctypes.byref(header), ctypes.byref(data))
    if _prctl(PR_SET_NO_NEW_PRIVS, 1) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def inside(path: str, translate: list) -> str | None:
    """Where host path `path` of the interpreter is inside the root; None if it is not there."""
    for host, there in translate:
        if path == host or path.startswith(host + os.sep):
            return there + path[len(host):]
    return None


def confine(plan: dict) -> None:
    """The runner's part: no capabilities, and the interpreter's paths as they are inside."""
    drop_capabilities()
    moved = [inside(p, plan["translate"]) for p in sys.path]
    sys.path[:] = [p for p in moved if p is not None]  # the runner puts the folder first
    sys.path_importer_cache.clear()
    for module in list(sys.modules.values()):
        where = getattr(module, "__file__", None)
        if isinstance(where, str) and (there := inside(where, plan["translate"])):
            module.__file__ = there
    sys.prefix = sys.exec_prefix = sys.base_prefix = sys.base_exec_prefix = "/python"
    sys.executable = ""  # no interpreter can be started inside
