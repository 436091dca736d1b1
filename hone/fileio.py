"""Folders that appear whole or not at all.

Exports (Hugging Face folders, PEFT adapters) are written into a temporary sibling folder that
replaces the target only when everything is written, so a failure (a full disk, a bad tensor)
never leaves a half-written model where a user expects a complete one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


@contextmanager
def atomic_folder(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `out_dir` (an existing one included)."""
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", dir=out_dir.parent))
    try:
        yield tmp
        if out_dir.exists():
            old = out_dir.with_name(f".{out_dir.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(out_dir, old)
            os.replace(tmp, out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
