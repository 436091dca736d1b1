"""Content manifests of checkpoint step folders: what was written, so a resume can tell a whole
checkpoint from a damaged one.

Each step folder holds `manifest.json`: every file in the folder (relative path, size, sha256)
and a "checkpoint hash", the sha256 over that sorted list, which names the checkpoint's
exact content in one string (a run logs it when it resumes).

Design choices:
- The manifest is written inside Orbax's temporary step folder, after Orbax's last write to it
  (the commit timestamp and commit_success.txt) and just before the rename that commits the
  step. A step folder therefore appears together with its manifest or not at all: a run killed
  at any moment never leaves a committed step without one, and an asynchronous save stays
  asynchronous (the hashing runs on Orbax's background thread). The hook is a TemporaryPath
  class (Orbax's `temporary_path_class` option) whose `finalize` repeats Orbax 0.12.8's
  AtomicRenameTemporaryPath.finalize with the manifest added before the rename; the version is
  locked in requirements/lock.txt (pyproject.toml allows 0.12.x) and
  tests/train/test_checkpoint_safety.py checks the result.
- The manifest itself is written to a temporary name, fsynced and renamed, so it is never seen
  half-written even outside Orbax's protocol (`python -m hone.checkpoint.manifest write`).
- Verification is strict: a missing file, a file the manifest does not list, another size or
  another sha256 all make the step unusable, and an edited manifest is caught because its
  checkpoint hash no longer matches its own file list. Sizes are compared before any hashing,
  so a truncated file is reported as such and costs no reading.
- Files are hashed on a few threads: hashlib releases the GIL, and a large checkpoint is many
  files (one per array shard), so reading them back overlaps.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from orbax.checkpoint._src.metadata import checkpoint as checkpoint_metadata
from orbax.checkpoint._src.path import async_path, atomicity

MANIFEST = "manifest.json"
FORMAT = 1  # bump when the layout of manifest.json changes
_TMP = MANIFEST + ".tmp"


class ManifestError(ValueError):
    """A step folder that does not match its manifest; the message says how."""


def _file_sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _hash_files(root: Path, names: list[str]) -> list[str]:
    with ThreadPoolExecutor(max_workers=max(1, min(8, len(names)))) as pool:
        return list(pool.map(lambda n: _file_sha256(root / n), names))


def _listed_files(step_dir: Path) -> list[str]:
    """Relative POSIX paths of every file under step_dir except the manifest itself."""
    names = []
    for parent, _, files in os.walk(step_dir):
        for f in files:
            name = (Path(parent) / f).relative_to(step_dir).as_posix()
            if name not in (MANIFEST, _TMP):
                names.append(name)
    return sorted(names)


def checkpoint_hash(files: dict[str, dict]) -> str:
    """sha256 over the sorted (path, size, sha256) entries: one name for the whole content."""
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(f"{name}\0{files[name]['size']}\0{files[name]['sha256']}\n".encode())
    return h.hexdigest()


def write_manifest(step_dir: str | Path) -> str:
    """Hash every file in step_dir into step_dir/manifest.json; returns the checkpoint hash."""
    step_dir = Path(step_dir)
    names = _listed_files(step_dir)
    digests = _hash_files(step_dir, names)
    files = {n: {"size": (step_dir / n).stat().st_size, "sha256": d}
             for n, d in zip(names, digests)}
    digest = checkpoint_hash(files)
    body = json.dumps({"format": FORMAT, "algorithm": "sha256", "checkpoint_hash": digest,
                       "files": files}, indent=1, sort_keys=True)
    tmp = step_dir / _TMP
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(body)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, step_dir / MANIFEST)
    return digest


def verify_manifest(step_dir: str | Path) -> str:
    """The checkpoint hash of step_dir if its files match its manifest; ManifestError if not."""
    step_dir = Path(step_dir)
    try:
        body = json.loads((step_dir / MANIFEST).read_text(encoding="utf-8"))
        files, stored = body["files"], body["checkpoint_hash"]
        computed = checkpoint_hash(files)
    except FileNotFoundError:
        raise ManifestError(f"it has no {MANIFEST} (deleted, or written before hone kept "
                            f"manifests)") from None
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ManifestError(f"its {MANIFEST} is unreadable ({type(e).__name__}: {e})") from None
    if computed != stored:
        raise ManifestError(f"its {MANIFEST} was altered (the checkpoint hash it records does "
                            f"not match its own file list)")
    present = _listed_files(step_dir)
    missing = sorted(set(files) - set(present))
    if missing:
        raise ManifestError(f"file(s) missing: {', '.join(missing[:5])}")
    extra = sorted(set(present) - set(files))
    if extra:
        raise ManifestError(f"file(s) not in its {MANIFEST}: {', '.join(extra[:5])}")
    for name in present:
        size = (step_dir / name).stat().st_size
        if size != files[name]["size"]:
            raise ManifestError(f"{name} is {size} bytes, the manifest says "
                                f"{files[name]['size']} (truncated or overwritten)")
    for name, digest in zip(present, _hash_files(step_dir, present)):
        if digest != files[name]["sha256"]:
            raise ManifestError(f"{name} differs from its manifest entry (sha256 {digest[:16]}..., "
                                f"expected {files[name]['sha256'][:16]}...)")
    return stored


def manifest_writing_path_class(root: str | Path) -> type:
    """An Orbax TemporaryPath class that commits each step folder directly under `root` with a
    manifest: Orbax's atomic-rename protocol with write_manifest() run just before the rename.

    Orbax uses the same class for the item folders inside a step (`state/`, `data/`); those
    keep Orbax's own finalize, since the step's manifest covers them.
    """
    root = str(Path(root).absolute())

    class ManifestedAtomicRename(atomicity.AtomicRenameTemporaryPath):
        async def finalize(self):
            if str(self._final_path.parent) != root or self._snapshot is not None:
                return await super().finalize()
            # Orbax 0.12.8's AtomicRenameTemporaryPath.finalize, step by step: the commit
            # timestamp into the step metadata, then commit_success.txt, then the rename...
            store = self._checkpoint_metadata_store
            if store:
                await asyncio.to_thread(store.wait_until_finished)
                await asyncio.to_thread(
                    store.update,
                    file_path=checkpoint_metadata.step_metadata_file_path(self._tmp_path),
                    commit_timestamp_nsecs=time.time_ns())
                await asyncio.to_thread(store.wait_until_finished)
            await async_path.write_text(
                self.get() / atomicity.COMMIT_SUCCESS_FILE,
                f"Checkpoint commit was successful to {self._final_path}")
            # ...with the manifest written last, over the folder's final content.
            await asyncio.to_thread(write_manifest, Path(self._tmp_path))
            await async_path.rename(self._tmp_path, self._final_path)

    return ManifestedAtomicRename


def main(argv: list[str] | None = None) -> int:
    """`python -m hone.checkpoint.manifest verify|write STEP_DIR...`: check step folders, or
    adopt ones written before manifests existed (after checking that they restore)."""
    parser = argparse.ArgumentParser(prog="python -m hone.checkpoint.manifest")
    parser.add_argument("action", choices=["verify", "write"])
    parser.add_argument("step_dirs", nargs="+")
    args = parser.parse_args(argv)
    failed = 0
    for step_dir in args.step_dirs:
        try:
            digest = (write_manifest if args.action == "write" else verify_manifest)(step_dir)
            print(f"{step_dir}: {digest}")
        except (ManifestError, OSError) as e:
            print(f"{step_dir}: {e}")
            failed = 1
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
