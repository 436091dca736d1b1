"""Offline distillation: the teacher's top-k logits of every training row, computed once and kept
on disk, then read back per batch so training steps run no teacher forward.

Layout (run_dir/teacher_topk/): values.npy float32 [R, L, K], indices.npy int32 [R, L, K],
meta.json (teacher source and dtype, k, rows, row length and a SHA-256 of the rows' tokens and
masks). The folder is written under a temporary name and renamed when complete, so a killed run
never leaves a partial cache that looks whole; a cache whose meta does not match the run's data
and teacher is rebuilt, not trusted. Batches carry the row ids so a shuffled batch finds its entries.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import jax
import numpy as np

from hone.data.loader import TrainIterator, ordered_batches
from hone.distill.loss import INPUT_KEYS, NO_MAPS, teacher_forward
from hone.losses.distill import topk_logits

CACHE = "teacher_topk"


def fingerprint(rows: dict[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for key in ("tokens", "loss_mask", "attention_mask", "segment_ids"):
        h.update(np.ascontiguousarray(rows[key]).tobytes())
    return h.hexdigest()


def _meta(cfg, rows) -> dict:
    return {"teacher": cfg.teacher.source, "teacher_dtype": cfg.teacher.dtype,
            "vocab_map": cfg.distill.vocab_map,
            "k": cfg.distill.top_k, "rows": int(len(rows["tokens"])),
            "length": int(rows["tokens"].shape[1]), "fingerprint": fingerprint(rows)}


def build_cache(cfg, rows: dict[str, np.ndarray], teacher_def, teacher_state, run_dir: Path,
                *, batch_size: int, vocab=None, log=print) -> tuple[np.ndarray, np.ndarray]:
    """(values, indices) memory-mapped from run_dir/teacher_topk, computed first if missing or
    stale."""
    folder = Path(run_dir) / CACHE
    want = _meta(cfg, rows)
    meta_path = folder / "meta.json"
    if meta_path.exists():
        if json.loads(meta_path.read_text()) == want:
            log(f"teacher cache: reusing {folder} ({want['rows']} rows, top-{want['k']})")
            return _open(folder)
        log(f"teacher cache: {folder} was made for other data or another teacher; rebuilding")
        shutil.rmtree(folder)
    tmp = folder.with_name(CACHE + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    r, length, k = want["rows"], want["length"], want["k"]
    values = np.lib.format.open_memmap(tmp / "values.npy", "w+", np.float32, (r, length, k))
    indices = np.lib.format.open_memmap(tmp / "indices.npy", "w+", np.int32, (r, length, k))

    @jax.jit
    def top(state, mb):
        logits, _, _ = teacher_forward(teacher_def, state, mb, NO_MAPS, vocab)
        return topk_logits(logits, k)

    inputs = {key: rows[key] for key in INPUT_KEYS}
    # One compiled shape: the short last batch is filled with copies of row 0 (then dropped).
    batches = ordered_batches(inputs, batch_size, -(-r // batch_size),
                              lambda n: {key: np.repeat(v[:1], n, 0) for key, v in inputs.items()})
    for b, mb in enumerate(batches):
        start = b * batch_size
        n = min(batch_size, r - start)
        v, i = jax.device_get(top(teacher_state, mb))
        values[start:start + n], indices[start:start + n] = v[:n], i[:n]
    values.flush()
    indices.flush()
    del values, indices
    (tmp / "meta.json").write_text(json.dumps(want, indent=1))
    tmp.rename(folder)
    log(f"teacher cache: wrote {folder} ({r} rows x {length} positions x top-{k}, "
        f"{(r * length * k * 8) / 2**20:.1f} MiB)")
    return _open(folder)


def _open(folder: Path) -> tuple[np.ndarray, np.ndarray]:
    return (np.load(folder / "values.npy", mmap_mode="r"),
            np.load(folder / "indices.npy", mmap_mode="r"))


def cached_iterator(rows: dict[str, np.ndarray], batch_size: int, seed: int,
                    values: np.ndarray, indices: np.ndarray) -> TrainIterator:
    """Training batches (the same order and state as SFTData.iterator() would give) that also
    carry teacher_values and teacher_indices [B, L, K] read from the cache."""
    with_ids = dict(rows, row_id=np.arange(len(rows["tokens"]), dtype=np.int64))

    def attach(batch):
        batch = dict(batch)
        ids = np.asarray(batch.pop("row_id"))
        batch["teacher_values"] = np.asarray(values[ids])
        batch["teacher_indices"] = np.asarray(indices[ids])
        return batch

    return TrainIterator(with_ids, batch_size, seed, transform=attach)
