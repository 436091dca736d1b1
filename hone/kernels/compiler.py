"""Compiles hone's CPU kernels once per machine and registers them with XLA.

The C++ source ships with the package; the first process that needs a kernel compiles it with
the machine's C++ compiler (`$CXX`, else g++, else c++) for the CPU it runs on (-march=native)
into `$HONE_CACHE/kernels` (default ~/.cache/hone/kernels), named by a hash of the source, the
flags, the jaxlib version and the CPU, so a cache shared by different machines or jaxlib
versions never loads a foreign build. The build is written to a temporary name and renamed into
place: processes that compile at the same time each get a whole file.

When there is no compiler, no x86-64 CPU with AVX2 and FMA, or the build fails, `library()`
returns None, says why once (a warning), and hone computes with XLA's own kernels: the same
numbers up to float32 summation order, slower. HONE_CPU_KERNELS=0 turns the kernels off.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import jax
import jaxlib

HERE = Path(__file__).parent
SOURCES = [HERE / "packed_matmul.cc", HERE / "decode_attention.cc"]
HEADERS = [HERE / "common.h"]
FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-w"]
# XLA custom-call targets: the FFI handler each registers.
TARGETS = {"hone_packed_matmul": "HonePackedMatmul", "hone_packed_gated": "HonePackedGated",
           "hone_decode_attention": "HoneDecodeAttention",
           "hone_paged_decode_attention": "HonePagedDecodeAttention"}


class Unavailable(RuntimeError):
    """Why the CPU kernels cannot be used on this machine."""


def cache_dir() -> Path:
    return Path(os.environ.get("HONE_CACHE") or Path.home() / ".cache" / "hone") / "kernels"


@functools.cache
def _cpu_signature() -> str:
    """The CPU model and instruction-set flags: a build is only reused on a CPU like this one."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine()
    keep = [line for line in text.splitlines()
            if line.startswith(("model name", "flags"))][:2]
    return "\n".join(keep)


def _cpu_supported() -> None:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        raise Unavailable(f"written for x86-64 (AVX2 + FMA); this machine is "
                          f"{platform.machine()}")
    flags = _cpu_signature()
    if "flags" in flags and not all(f" {f}" in flags for f in ("avx2", "fma")):
        raise Unavailable("the CPU lacks AVX2 or FMA")


def _compiler() -> str:
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return name
    raise Unavailable("no C++ compiler found (set CXX, or install g++)")


def build() -> Path:
    """Path of the compiled kernel library for this machine, compiling it if needed."""
    _cpu_supported()
    cxx = _compiler()
    texts = [path.read_bytes() for path in SOURCES + HEADERS]
    key = hashlib.sha256(b"\0".join([
        *texts, " ".join(FLAGS).encode(), cxx.encode(), jaxlib.__version__.encode(),
        _cpu_signature().encode()])).hexdigest()[:16]
    out = cache_dir() / f"hone_kernels-{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".so.tmp")
    os.close(fd)
    cmd = [cxx, *FLAGS, f"-I{jax.ffi.include_dir()}", *map(str, SOURCES), "-o", tmp]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise Unavailable(f"compiling hone's kernels failed ({' '.join(cmd)}):\n"
                              f"{proc.stderr[-2000:]}")
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return out


@functools.cache
def _load() -> ctypes.CDLL:
    lib = ctypes.cdll.LoadLibrary(str(build()))
    for target, symbol in TARGETS.items():
        jax.ffi.register_ffi_target(target, jax.ffi.pycapsule(getattr(lib, symbol)),
                                    platform="cpu")
    return lib


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded, registered kernel library, or None (with one warning saying why)."""
    if os.environ.get("HONE_CPU_KERNELS", "1") == "0":
        return None
    try:
        return _load()
    except (Unavailable, OSError, AttributeError) as e:
        warnings.warn(f"hone's CPU decode kernels are off, XLA's products are used instead: {e}",
                      RuntimeWarning, stacklevel=2)
        return None


def panel_width() -> int:
    """Columns per weight panel of the loaded build (24 with AVX2, 48 with AVX-512)."""
    lib = library()
    if lib is None:
        raise Unavailable("the CPU kernels are not available")
    return int(lib.hone_panel_width())
