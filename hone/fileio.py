"""Folders that appear whole or not at all.

Exports (Hugging Face folders, PEFT adapters) are written into a temporary sibling folder that
replaces the target only when everything is written, so a failure (a full disk, a bad tensor)
never leaves a half-written model where a user expects a complete one.

Replacing is the dangerous part: `--out ~` must not delete a home folder. An existing target is
replaced only when it holds nothing but the files a model export consists of (no subfolders,
no links, no other kinds of file); anything else is refused before a byte is written. Every file
is written inside the temporary folder under a fixed name, so nothing lands outside the target.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from hone.errors import InputError

# What an export writes: weights, their index, configs, tokenizer files, a chat template.
EXPORT_SUFFIXES = (".safetensors", ".json", ".jinja", ".txt", ".model", ".md")


@contextmanager
def atomic_folder(out_dir: str | Path) -> Iterator[Path]:
    """Yield a temporary folder; on success it replaces `out_dir` (an existing one included)."""
    out_dir = Path(out_dir)
    check_replaceable(out_dir)
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


def check_replaceable(out_dir: Path) -> None:
    """InputError unless `out_dir` is absent, empty, or an earlier export (model files only)."""
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise InputError("exists and is not a folder; choose a new folder to export into",
                         path=str(out_dir))
    if not out_dir.exists():
        return
    foreign = [p.name for p in out_dir.iterdir()
               if p.is_symlink() or not p.is_file() or not p.name.endswith(EXPORT_SUFFIXES)]
    if foreign:
        raise InputError(
            f"exists and holds {', '.join(sorted(foreign)[:5])}"
            f"{' ...' if len(foreign) > 5 else ''}, which an export does not write; an export "
            f"replaces its folder whole, so it only overwrites a new, empty or earlier export "
            f"folder. Choose another --out", path=str(out_dir))
