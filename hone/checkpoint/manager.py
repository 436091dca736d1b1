"""Orbax checkpoints of the whole run state: parameters (adapters only when training adapters),
optimizer state, step, RNG key, and the data iterator's position.

Design choices:
- Orbax writes each checkpoint to a temporary folder and renames it when complete, so a
  checkpoint is either whole or absent. Saves are asynchronous: training continues while the
  previous step's arrays are written. The newest `keep` checkpoints are kept.
- Every step folder carries a manifest of its files' sizes and sha256 hashes, written just
  before Orbax's rename (hone/checkpoint/manifest.py). A resume verifies it and falls back to the
  next older checkpoint when a file is missing, truncated or altered, or when Orbax cannot read
  it, warning with the step and the reason. When checkpoints exist but none is usable the run
  stops (CheckpointError): training from scratch over them would hide the damage.
- Unusable steps newer than the one restored are renamed aside (`<step>.unusable-<time>`,
  which Orbax does not list), so the resumed run can save those step numbers again and keep
  the damaged files for inspection.
- One writer per folder: a Checkpointer opened with `exclusive=True` (the training loop) holds
  an flock on `<folder>/lock` for its lifetime; a second one is refused with the holder's pid
  and host. The kernel drops the lock when the process dies, so a killed run resumes at once.
  Readers (export, tests, inspection) take no lock: a running run can be exported.
- A save that fails for lack of disk space (ENOSPC, however Orbax wraps it, raised at save,
  wait or close for asynchronous saves) never touches the earlier checkpoints: Orbax deletes
  old steps only after a new one commits. Its temporary folder is removed and the run stops
  with a CheckpointError naming the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from hone.checkpoint.manifest import ManifestError, manifest_writing_path_class, verify_manifest
from hone.errors import InputError

# Orbax logs every save at INFO; a progress bar is the place for that.
logging.getLogger("absl").setLevel(logging.WARNING)
# "hone.checkpoint.manager": its records propagate to the "hone.checkpoint" logger.
log = logging.getLogger(__name__)

LOCK = "lock"  # the lock file inside the checkpoint folder; it holds "pid@host" of the holder
_TMP_SUFFIX = ocp.path.atomicity.TMP_DIR_SUFFIX  # Orbax's uncommitted step folders


class CheckpointError(InputError):
    """Checkpoints that cannot be used or written: all damaged, held by another run, disk full.
    An InputError, so the command line prints it as one paragraph (exit code 2)."""


@dataclass
class Restored:
    """What restore_latest() found: the step, its contents, and the hash that names them."""

    step: int
    state: dict[str, Any]
    data_state: dict
    checkpoint_hash: str  # sha256 naming the restored step folder's exact content


def _is_no_space(e: BaseException) -> bool:
    """ENOSPC anywhere in the chain: an OSError from Python writes, or the message text of an
    error from tensorstore's C++ writer (which Orbax re-raises as ValueError or similar)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if os.strerror(errno.ENOSPC) in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


class _FolderLock:
    """An exclusive flock on folder/lock, released by release() or by the process's death.

    release() deletes the file, so a cleanly finished run leaves only its checkpoints behind.
    Deleting a lock file is safe only with a check on the other side: a process that opened
    the file just before it was deleted may then lock a name-less inode, so after locking it
    retries unless the path still names the inode it holds. A SIGKILLed holder leaves the file,
    unlocked; its pid is stale but harmless, since the kernel dropped the flock.
    """

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / LOCK
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                if not isinstance(e, BlockingIOError):  # no flock here (some network mounts)
                    raise
                pid, _, host = holder.partition("@")
                raise CheckpointError(
                    f"these checkpoints are in use by another run (pid {pid}"
                    f"{' on ' + host if host else ''}, recorded in {self.path}); two runs "
                    f"writing one folder would overwrite each other's checkpoints. Wait for "
                    f"that run to finish or stop it, or give this run another run_dir",
                    path=str(folder)) from None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the holder deleted the file as we opened it: lock the new one
        self.fd = fd
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}@{socket.gethostname()}\n".encode(), 0)

    def release(self) -> None:
        if self.fd is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)  # while still locked: no one can hold this inode now
            os.close(self.fd)  # closing the only descriptor drops the flock
            self.fd = None


def ensure_unlocked(folder: str | Path) -> None:
    """Raise CheckpointError now if another run holds `folder`: called before a run writes
    anything into its run_dir (its config.yaml), so a refused second run changes nothing."""
    _FolderLock(Path(folder).absolute()).release()


class Checkpointer:
    """One run's checkpoint folder: verified restores, manifested saves, one writer at a time."""

    def __init__(self, directory: str | Path, *, keep: int, async_save: bool = True,
                 exclusive: bool = False):
        """exclusive=True: this process trains into the folder. It takes the folder's lock
        (process 0 of a multi-process run), may save, removes Orbax's leftover temporary
        folders, and sets aside unusable steps on restore. exclusive=False: read only."""
        self.directory = Path(directory).absolute()
        self.exclusive = exclusive
        self._primary = jax.process_index() == 0
        self._in_flight: int | None = None  # the step an asynchronous save is still writing
        self._failed = False  # a save ran out of space: its partial folder is removed on close
        self._lock = _FolderLock(self.directory) if exclusive and self._primary else None
        try:
            self.manager = ocp.CheckpointManager(
                self.directory,
                options=ocp.CheckpointManagerOptions(
                    max_to_keep=keep, enable_async_checkpointing=async_save,
                    # A writer owns the folder, so any temporary step folder is a dead one.
                    cleanup_tmp_directories=exclusive,
                    temporary_path_class=manifest_writing_path_class(self.directory)),
                item_names=("state", "data"))
        except BaseException:
            self._release()
            raise

    def latest_step(self) -> int | None:
        """The newest committed step (not verified; restore_latest() verifies)."""
        return self.manager.latest_step()

    def save(self, step: int, state: dict[str, Any], data_state: dict) -> None:
        if not self.exclusive:
            raise RuntimeError("this Checkpointer is read only; open it with exclusive=True "
                               "to save")
        with self._saving(self._in_flight):  # an earlier asynchronous save may fail here
            self.manager.wait_until_finished()
        self._in_flight = None
        with self._saving(step):
            self.manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)))
        self._in_flight = step

    def restore_latest(self, like: dict[str, Any]) -> Restored | None:
        """The newest checkpoint that verifies and restores, into the structure, shapes and
        shardings of `like`; None when there is none at all. Unusable newer steps are skipped
        with a warning (and set aside by a writer); CheckpointError when all are unusable."""
        steps = sorted(self.manager.all_steps(), reverse=True)
        unusable: list[tuple[int, str]] = []
        for step in steps:
            try:
                state, data_state, digest = self._verified_restore(step, like)
            except Exception as e:  # noqa: BLE001 - any failure makes the step unusable
                reason = str(e) if isinstance(e, ManifestError) else \
                    f"Orbax could not restore it ({type(e).__name__}: {str(e)[:300]})"
                log.warning("checkpoint step %d in %s is unusable: %s; trying the next older "
                            "one", step, self.directory, reason)
                unusable.append((step, reason))
                continue
            self._set_aside([s for s, _ in unusable])
            return Restored(step, state, data_state, digest)
        if unusable:
            listing = "; ".join(f"step {s}: {r}" for s, r in unusable)
            raise CheckpointError(
                f"none of the {len(unusable)} checkpoints can be used ({listing}). Not starting "
                f"from scratch over them: move the folder away to start a fresh run, or put "
                f"back intact step folders to resume (a step written before manifests existed "
                f"can be adopted with `python -m hone.checkpoint.manifest write STEP_DIR` once "
                f"you trust it)", path=str(self.directory))
        return None

    def restore(self, step: int, like: dict[str, Any]) -> tuple[dict[str, Any], dict]:
        """(state, data_state) of `step`, verified; `like` gives the structure, shapes and
        shardings."""
        state, data_state, _ = self._checked(step, lambda: self._verified_restore(step, like))
        return state, data_state

    def read(self, step: int | None = None) -> tuple[dict[str, Any], dict]:
        """(state, data_state) of `step` (default: the newest usable one) as saved, without a
        template: for exports and inspection."""
        if step is not None:
            state, data_state, _ = self._checked(step, lambda: self._verified_restore(step))
            return state, data_state
        if self.latest_step() is None:
            raise FileNotFoundError(f"no checkpoint in {self.directory}")
        restored = self.restore_latest(None)
        return restored.state, restored.data_state

    def wait(self) -> None:
        with self._saving(self._in_flight):
            self.manager.wait_until_finished()
        self._in_flight = None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            self.manager.close()
            if self._failed:
                self._remove_partial()
            self._release()

    # -- internals ---------------------------------------------------------------------------

    def _verified_restore(self, step: int, like=None) -> tuple[dict, dict, str]:
        digest = verify_manifest(self.directory / str(step))
        if like is None:
            state_args = ocp.args.StandardRestore()
        else:
            state_args = ocp.args.StandardRestore(
                jax.tree.map(ocp.utils.to_shape_dtype_struct, like))
        out = self.manager.restore(step, args=ocp.args.Composite(
            state=state_args, data=ocp.args.JsonRestore()))
        return out.state, out.data, digest

    def _checked(self, step: int, restore):
        try:
            return restore()
        except ManifestError as e:
            raise CheckpointError(f"checkpoint step {step} is unusable: {e}",
                                  path=str(self.directory)) from None

    def _set_aside(self, steps: list[int]) -> None:
        """Rename unusable step folders out of Orbax's sight (writers only)."""
        if not (self.exclusive and steps):
            return
        if self._primary:
            stamp = time.strftime("%Y%m%d-%H%M%S")
            for step in steps:
                aside = self.directory / f"{step}.unusable-{stamp}"
                os.rename(self.directory / str(step), aside)
                log.warning("moved unusable checkpoint step %d aside to %s", step, aside)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("hone:checkpoint_set_aside")
        self.manager.reload()

    @contextlib.contextmanager
    def _saving(self, step: int | None):
        """Turn a failed save for lack of space into a CheckpointError, its partial folder
        removed; any other failure propagates unchanged."""
        try:
            yield
        except Exception as e:
            if not _is_no_space(e):
                raise
            self._failed = True
            self._remove_partial()
            self.manager.reload()  # Orbax's list already dropped the steps this save replaces
            kept = ", ".join(str(s) for s in self.manager.all_steps()) or "none"
            raise CheckpointError(
                f"no space left on the device while saving checkpoint step {step}; that "
                f"checkpoint was not written and the earlier ones are intact (steps: {kept}). "
                f"Free some space and run the same command to resume",
                path=str(self.directory)) from e

    def _remove_partial(self) -> None:
        """Remove Orbax's temporary step folders after a failed save (writers only). Orbax
        ignores them when listing steps, and a synchronous save's writer threads may still
        recreate one after the error, so close() repeats this and the next writer's Orbax
        (cleanup_tmp_directories) removes any that remain."""
        if self.exclusive and self._primary:
            for partial in self.directory.glob(f"*{_TMP_SUFFIX}*"):
                shutil.rmtree(partial, ignore_errors=True)

    def _release(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None
