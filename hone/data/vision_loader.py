"""Vision-language SFT data end to end: records -> examples with frames -> fixed-shape batches.

`VisionSFTData` is `hone.data.loader.SFTData` for records with images (hone/data/vision.py): the
records are tokenized once, up front, into padded token rows (one record a row, never packed:
a row's frames fill its placeholders), and each batch gets its rows' frames as
`pixel_values` [B, F, 3, tile, tile] and `pixel_attention_mask` [B, F, tile, tile], F the most
frames of a training record (or `max_frames`), so every step has one shape. The shuffled
iterator is SFTData's (the same Grain pipeline over the rows; its state a few integers, so a
resumed run gets exactly the batches it would have), the frames looked up by row.

The frames are kept in host memory as float32 (3 x tile x tile x 4 bytes each: 1.8 MB at
SmolVLM's 384-pixel tiles), computed once when the records are read.

`image_settings(folder)` reads a model folder's preprocessing: preprocessor_config.json and
processor_config.json as transformers writes them for Idefics3 / SmolVLM, defaults from the
model's config.json where they are missing.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterator

import numpy as np

from hone.data.collate import empty_rows, pad_rows
from hone.data.loader import TrainIterator, check_batch_size, load_records, ordered_batches
from hone.data.vision import VisionStats, frame_arrays, tokenize_vision_sft
from hone.errors import InputError
from hone.models.vision.idefics3_processor import Idefics3ImageSettings
from hone.weights.hf import read_json


def _optional_json(file: Path) -> dict:
    return read_json(file) if file.is_file() else {}


def image_settings(folder: str | Path) -> Idefics3ImageSettings:
    """A model folder's image preprocessing (transformers' file and key names)."""
    folder = Path(folder)
    config = read_json(folder / "config.json")
    pre = _optional_json(folder / "preprocessor_config.json")
    proc = _optional_json(folder / "processor_config.json")
    vision = config.get("vision_config") or {}
    tile = int(vision.get("image_size", 364))
    patch = int(vision.get("patch_size", 14))
    scale = int(config.get("scale_factor", 2))
    seq_len = proc.get("image_seq_len", pre.get("image_seq_len"))
    want = (tile // patch) ** 2 // scale ** 2
    kw = dict(longest_edge=int((pre.get("size") or {}).get("longest_edge", 4 * tile)),
              tile=int((pre.get("max_image_size") or {}).get("longest_edge", tile)),
              split=bool(pre.get("do_image_splitting", True)),
              image_seq_len=int(seq_len) if seq_len is not None else want)
    if pre.get("resample") is not None:
        kw["resample"] = int(pre["resample"])
    if pre.get("rescale_factor") is not None:
        kw["rescale_factor"] = float(pre["rescale_factor"])
    for key, name in (("image_mean", "mean"), ("image_std", "std")):
        if pre.get(key) is not None:
            kw[name] = tuple(float(x) for x in pre[key])
    settings = Idefics3ImageSettings(**kw)
    if config and (settings.tile != tile or settings.image_seq_len != want):
        raise InputError(f"the processor's tiles of {settings.tile} pixels and "
                         f"{settings.image_seq_len} placeholders each do not fit the model's "
                         f"{tile}-pixel images of {want} features", path=str(folder))
    return settings


class VisionSFTData:
    """Tokenized, padded SFT rows of records with images, and their frames.

    Attributes as SFTData's (`rows`, `stats` a VisionStats, `num_rows`, `max_length`,
    `pad_id`, `batch_size`, `seed`) plus `frames` (F, the frames each batch row has room for),
    `tile` and `format` ("messages")."""

    def __init__(self, path: str, tokenizer, *, settings: Idefics3ImageSettings,
                 max_length: int = 2048, max_frames: int | None = None,
                 loss_on: str = "completion", overlong: str = "truncate",
                 max_records: int | None = None, batch_size: int = 8, seed: int = 0,
                 records: list[dict] | None = None, base_dir: str | Path | None = None):
        self.batch_size = check_batch_size(batch_size)
        self.seed = int(seed)
        self.path = path = str(path)
        self.format = "messages"
        self.max_length, self.tile = max_length, settings.tile
        self.pad_id = int(tokenizer.pad_id)
        records = load_records(path, records, max_records)
        base = Path(base_dir) if base_dir is not None else Path(path).parent
        self.stats = VisionStats()
        examples = []
        for index, record in enumerate(records):
            example = tokenize_vision_sft(record, tokenizer, settings=settings, loss_on=loss_on,
                                          max_length=max_length, max_frames=max_frames,
                                          overlong=overlong, base_dir=base, path=path,
                                          index=index, stats=self.stats)
            if example is not None:
                examples.append(example)
        if not examples:
            raise InputError(f"no record is left to train on ({self.stats})", path=path)
        self.frames = max_frames or max(1, max(len(e.frames) for e in examples))
        self.rows = pad_rows(examples, max_length, self.pad_id)
        self.rows["row"] = np.arange(len(examples), dtype=np.int32)  # to find its frames
        self._examples = examples
        self.num_rows = len(examples)

    @property
    def num_target_tokens(self) -> int:
        return int(self.rows["loss_mask"].sum())

    def describe(self) -> str:
        dropped = (f" (dropped records: {self.stats.dropped_records[:10]}"
                   f"{' ...' if len(self.stats.dropped_records) > 10 else ''})"
                   if self.stats.dropped_records else "")
        return (f"{self.path}: messages with images, {self.stats}{dropped}; {self.num_rows} padded "
                f"rows of {self.max_length} with room for {self.frames} frames of {self.tile} "
                f"pixels, {self.num_target_tokens} target tokens per epoch")

    def with_pixels(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch of rows (their "row" indices; -1 for padding rows) with its frames."""
        rows = batch.pop("row")
        examples = [self._examples[r] if r >= 0 else None for r in rows.tolist()]
        return dict(batch, **frame_arrays(examples, self.frames, self.tile))

    def iterator(self, batch_size: int | None = None, seed: int | None = None) -> TrainIterator:
        """Endless shuffled training batches with their frames (SFTData.iterator's)."""
        return TrainIterator(self.rows, self.batch_size if batch_size is None else batch_size,
                             self.seed if seed is None else seed, transform=self.with_pixels)

    def num_batches(self, batch_size: int | None = None) -> int:
        batch_size = self.batch_size if batch_size is None else check_batch_size(batch_size)
        return math.ceil(self.num_rows / batch_size)

    def batches(self, batch_size: int | None = None,
                max_batches: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Evaluation batches in order, the last filled with padding rows (no loss, no frames)."""
        batch_size = self.batch_size if batch_size is None else batch_size
        count = self.num_batches(batch_size)
        if max_batches is not None:
            count = min(count, max_batches)

        def filler(n):
            return dict(empty_rows(n, self.max_length, self.pad_id),
                        row=np.full((n,), -1, np.int32))

        for batch in ordered_batches(self.rows, batch_size, count, filler):
            yield self.with_pixels(batch)
