"""Shared pieces of the hostile-input fuzz tests (tests/fuzz/test_fuzz_*.py).

- `FUZZ`: the settings every reader's property runs under: 2,000 examples, derandomized (the
  same cases on every run, so CI is reproducible), no example database, no deadline (a slow
  example on a busy machine is not a failure; a hang is, and shows up as a slow test).
- `Scratch`: one temporary folder per test module (in memory where possible). Hypothesis runs
  each example in the same function call, so pytest's function-scoped `tmp_path` would be shared
  anyway (and hypothesis warns about it); a module-level folder says so plainly.
- `mostly`, `anywhere`, `HOSTILE_INTS`: strategy helpers the files share.
- `clear_or_ok`: the property itself. A reader either returns, or raises `InputError` whose
  message names the file; any other exception propagates and fails the test.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from hone.errors import InputError

EXAMPLES = 2000

FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.filter_too_much])

# Integers that break readers: zero, one, powers of two and their neighbours, the limits of
# 32- and 64-bit fields, and sizes far beyond any file (2**40 elements).
HOSTILE_INTS = (0, 1, 2, 3, 7, 31, 32, 33, 255, 256, 4095, 65535, 65536, 2**31 - 1, 2**31,
                2**32 - 1, 2**32, 2**40, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1)


def mostly(common: st.SearchStrategy, rare: st.SearchStrategy) -> st.SearchStrategy:
    """`common` seven times in eight, else `rare`. (A plain `common | rare` draws each branch of
    the flattened one_of equally often, so the many kinds of junk crowd out the well-formed
    inputs that reach a reader's deeper checks.)"""
    return st.integers(0, 7).flatmap(lambda n: rare if n == 7 else common)


# A position in a file, taken modulo its length. Hypothesis favours small integers; multiplying
# by a large odd constant (a bijection modulo 2**32) spreads them over the whole file.
anywhere = st.integers(0, 2**32 - 1).map(lambda n: n * 2654435761 % 2**32)


class Scratch:
    """A temporary folder for one test module, removed at interpreter exit."""

    def __init__(self, prefix: str):
        # Thousands of small writes: memory-backed /dev/shm where there is one (opening a file
        # for writing on a loaded disk can take milliseconds), else the usual temp folder.
        shm = Path("/dev/shm")
        where = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.root = Path(tempfile.mkdtemp(prefix=f"hone-fuzz-{prefix}-", dir=where))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)

    def write(self, name: str, data: bytes | str) -> Path:
        path = self.root / name
        if isinstance(data, str):
            data = data.encode("utf-8")
        path.write_bytes(data)
        return path

    def folder(self, name: str) -> Path:
        """The folder `name`, created on first use. Files are overwritten in place rather than
        the folder removed and made again: on some file systems rmdir takes milliseconds."""
        path = self.root / name
        path.mkdir(parents=True, exist_ok=True)
        return path


def clear_or_ok(read: Callable[[], Any], names: str | Path | tuple = ()) -> Any:
    """`read()`'s result, or None when it raised an InputError naming one of `names` (file or
    folder names; none to check when empty). Any other exception is a bug and propagates."""
    if isinstance(names, (str, Path)):
        names = (names,)
    try:
        return read()
    except InputError as err:
        message = str(err)
        assert message.strip(), "an InputError must say what is wrong"
        if names:
            assert any(str(n) in message for n in names), \
                f"the message does not name {[str(n) for n in names]}: {message}"
        return None
