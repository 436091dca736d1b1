"""Crash safety of checkpoints: content manifests, fallback past damaged steps, one writer per
folder, and a full disk that stops the run without harming earlier checkpoints.

The run-level tests share one uninterrupted tiny SFT run of 8 steps (checkpoints at 2, 4, 6, 8).
A copy of its folder without step 8 is what a run killed after saving step 6 leaves behind;
damaging step 6 must make the resume start from step 4 and still end with the same
parameters, bit for bit, as the uninterrupted run.
"""

import errno
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest

from hone.checkpoint import Checkpointer, CheckpointError
from hone.checkpoint.manifest import MANIFEST, ManifestError, verify_manifest, write_manifest
from hone.config import SFTConfig, load_config
from hone.recipes.sft import run_sft

ROOT = Path(__file__).resolve().parents[2]
BASE = ["log.sinks=[jsonl]", "train.max_steps=8", "checkpoint.every_steps=2",
        "checkpoint.keep=5", "data.eval_path=null", "data.max_records=64"]
QUIET = dict(log=lambda s: None)


def sft(run_dir, *extra):
    cfg = load_config(SFTConfig, str(ROOT / "configs/tiny/sft.yaml"),
                      [f"run_dir={run_dir}", *BASE, *extra])
    return run_sft(cfg, **QUIET)[1]


def steps(run_dir) -> list[str]:
    return sorted(p.name for p in (Path(run_dir) / "checkpoints").iterdir() if p.name != "lock")


def assert_same_params(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert np.array_equal(np.asarray(a[k]), np.asarray(b[k])), k


def losses(run_dir) -> list[str]:
    lines = (Path(run_dir) / "metrics.jsonl").read_text().splitlines()
    return [f'{json.loads(l)["step"]}:{json.loads(l)["loss"]!r}' for l in lines]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """(run folder, final params) of the uninterrupted run."""
    run_dir = tmp_path_factory.mktemp("straight")
    return run_dir, sft(run_dir)["params"]


def killed_after_step_6(straight, tmp_path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(straight[0], run_dir)
    shutil.rmtree(run_dir / "checkpoints" / "8")
    return run_dir


def largest_array_file(step_dir: Path) -> Path:
    return max((p for p in (step_dir / "state").rglob("*") if p.is_file()),
               key=lambda p: p.stat().st_size)


def flip_byte(step_dir):
    f = largest_array_file(step_dir)
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))


def truncate(step_dir):
    f = largest_array_file(step_dir)
    os.truncate(f, f.stat().st_size // 2)


def delete_manifest(step_dir):
    (step_dir / MANIFEST).unlink()


@pytest.mark.parametrize("damage, reason", [
    (flip_byte, "differs from its manifest entry"),
    (truncate, "truncated"),
    (delete_manifest, "no manifest.json"),
])
def test_damaged_newest_checkpoint_resumes_from_the_previous_one(straight, tmp_path, damage,
                                                                reason, caplog, capsys):
    run_dir = killed_after_step_6(straight, tmp_path)
    damage(run_dir / "checkpoints" / "6")
    step_4_hash = verify_manifest(run_dir / "checkpoints" / "4")
    with caplog.at_level(logging.WARNING, logger="hone.checkpoint"):
        final = sft(run_dir)
    warning = next(r.getMessage() for r in caplog.records if "unusable" in r.getMessage())
    assert "step 6" in warning and reason in warning
    assert f"resumed from step 4 of {run_dir / 'checkpoints'} (checkpoint sha256 " \
           f"{step_4_hash})" in capsys.readouterr().err
    assert_same_params(final["params"], straight[1])
    assert losses(run_dir) == losses(straight[0])
    # The damaged step was set aside and written again by the resumed run.
    names = steps(run_dir)
    assert [n for n in names if n.startswith("6.unusable-")] and {"6", "8"} <= set(names)
    verify_manifest(run_dir / "checkpoints" / "6")


def test_all_checkpoints_damaged_stops_instead_of_starting_over(straight, tmp_path):
    run_dir = killed_after_step_6(straight, tmp_path)
    for step in ("2", "4", "6"):
        truncate(run_dir / "checkpoints" / step)
    before = (run_dir / "metrics.jsonl").read_text()
    with pytest.raises(CheckpointError, match="none of the 3 checkpoints can be used") as e:
        sft(run_dir)
    assert str(run_dir / "checkpoints") in str(e.value) and "step 2:" in str(e.value)
    assert steps(run_dir) == ["2", "4", "6"]  # nothing moved or deleted
    assert (run_dir / "metrics.jsonl").read_text() == before  # nor the log cut back
    Checkpointer(run_dir / "checkpoints", keep=5, exclusive=True).close()  # lock released


def test_a_second_writer_is_refused_and_a_killed_one_frees_the_folder(tmp_path):
    folder = tmp_path / "run" / "checkpoints"
    first = Checkpointer(folder, keep=2, exclusive=True)
    with pytest.raises(CheckpointError, match=f"in use by another run \\(pid {os.getpid()}"):
        Checkpointer(folder, keep=2, exclusive=True)
    with pytest.raises(CheckpointError, match=str(folder)):
        sft(tmp_path / "run")
    assert steps(tmp_path / "run") == []  # the refused run wrote no checkpoint
    assert not (tmp_path / "run" / "config.yaml").exists()  # ... and no config.yaml
    Checkpointer(folder, keep=2).close()  # readers (export) are not locked out
    first.close()
    assert not (folder / "lock").exists()  # a clean close leaves only checkpoints
    # Another process: refused with its pid while alive; free at once after SIGKILL.
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from hone.checkpoint import Checkpointer; "
         f"c = Checkpointer({str(folder)!r}, keep=2, exclusive=True); print('held', flush=True); "
         "sys.stdin.read()"],
        cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(CheckpointError, match=f"pid {holder.pid} on "):
            Checkpointer(folder, keep=2, exclusive=True)
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert (folder / "lock").exists()  # left behind by the killed holder, but unlocked
    Checkpointer(folder, keep=2, exclusive=True).close()


def no_space(path):
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))


# Orbax leaves the other writes of the failed save running; one of them finds its event loop
# closed after the save was abandoned and Python reports it as unraisable.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_disk_full_stops_the_run_and_keeps_earlier_checkpoints(straight, tmp_path, monkeypatch):
    """ENOSPC from Orbax's own writer (the data-iterator JSON) during the asynchronous save of
    step 6 surfaces at the next save; resuming afterwards continues exactly from step 4."""
    from orbax.checkpoint._src.handlers import json_checkpoint_handler as jch
    original = jch.JsonCheckpointHandler._save_fn

    async def save_fn(self, x, directory):
        if "6.orbax-checkpoint-tmp" in str(directory):
            raise no_space(directory)
        return await original(self, x, directory)

    monkeypatch.setattr(jch.JsonCheckpointHandler, "_save_fn", save_fn)
    run_dir = tmp_path / "run"
    with pytest.raises(CheckpointError, match="no space left on the device while saving "
                                              "checkpoint step 6") as e:
        sft(run_dir)
    assert str(run_dir / "checkpoints") in str(e.value)
    # The earlier checkpoints are intact; Orbax ignores the partial folder of step 6 if one of
    # its writer threads recreated it after the error, and the next run removes it.
    assert [n for n in steps(run_dir) if n.isdigit()] == ["2", "4"]
    for step in ("2", "4"):
        verify_manifest(run_dir / "checkpoints" / step)
    monkeypatch.undo()
    assert_same_params(sft(run_dir)["params"], straight[1])
    assert steps(run_dir) == ["2", "4", "6", "8"]


@pytest.mark.parametrize("async_save", [True, False])
def test_disk_full_while_writing_the_manifest(tmp_path, monkeypatch, async_save):
    import hone.checkpoint.manifest as manifest

    def full(step_dir):
        raise no_space(step_dir)

    ckpt = Checkpointer(tmp_path, keep=1, async_save=async_save, exclusive=True)
    ckpt.save(1, {"w": jnp.arange(4.0)}, {"pos": 1})
    ckpt.wait()
    monkeypatch.setattr(manifest, "write_manifest", full)
    with pytest.raises(CheckpointError, match="step 2; that checkpoint was not written"):
        ckpt.save(2, {"w": jnp.arange(4.0) + 1}, {"pos": 2})
        ckpt.wait()
    ckpt.close()
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1"]  # keep=1 deleted nothing
    ckpt = Checkpointer(tmp_path, keep=1)
    restored = ckpt.restore_latest({"w": jnp.zeros(4)})
    ckpt.close()
    assert restored.step == 1 and restored.data_state == {"pos": 1}
    assert np.array_equal(restored.state["w"], np.arange(4.0))


def test_manifest_covers_every_file_and_catches_edits(tmp_path):
    ckpt = Checkpointer(tmp_path, keep=2, exclusive=True)
    ckpt.save(3, {"w": jnp.arange(8.0)}, {"pos": 3})
    ckpt.close()
    step_dir = tmp_path / "3"
    body = json.loads((step_dir / MANIFEST).read_text())
    on_disk = {p.relative_to(step_dir).as_posix() for p in step_dir.rglob("*") if p.is_file()}
    # Everything Orbax wrote, including what its commit writes last, and nothing changed since.
    assert set(body["files"]) == on_disk - {MANIFEST}
    assert {"commit_success.txt", "_CHECKPOINT_METADATA"} <= set(body["files"])
    assert json.loads((step_dir / "_CHECKPOINT_METADATA").read_text())["commit_timestamp_nsecs"]
    digest = verify_manifest(step_dir)
    ckpt = Checkpointer(tmp_path, keep=2)
    assert ckpt.restore_latest({"w": jnp.zeros(8)}).checkpoint_hash == digest
    ckpt.close()
    assert verify_manifest(step_dir) == digest  # restoring writes nothing
    (step_dir / "stray").write_text("x")
    with pytest.raises(ManifestError, match="not in its manifest.json: stray"):
        verify_manifest(step_dir)
    (step_dir / "stray").unlink()
    name = next(iter(body["files"]))
    body["files"][name]["size"] += 1
    (step_dir / MANIFEST).write_text(json.dumps(body))
    with pytest.raises(ManifestError, match="altered"):
        verify_manifest(step_dir)


def test_a_step_orbax_cannot_read_is_skipped(tmp_path, caplog):
    ckpt = Checkpointer(tmp_path, keep=3, exclusive=True)
    for step in (1, 2):
        ckpt.save(step, {"w": jnp.arange(4.0) * step}, {"pos": step})
    ckpt.close()
    (tmp_path / "2" / "data" / "metadata").write_text("{not json")
    write_manifest(tmp_path / "2")  # damage the manifest vouches for: only Orbax can tell
    ckpt = Checkpointer(tmp_path, keep=3, exclusive=True)
    with caplog.at_level(logging.WARNING, logger="hone.checkpoint"):
        restored = ckpt.restore_latest({"w": jnp.zeros(4)})
    assert restored.step == 1
    assert any("step 2" in r.getMessage() and "Orbax could not restore it" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(CheckpointError, match="none of the 1 checkpoints"):
        ckpt.restore_latest({"w": jnp.zeros(5)})  # another shape: nothing restores
    ckpt.close()
