"""Preference pairs with images: conversational `prompt` records whose messages carry image parts
(hone/data/vision.py's format: `images`, or images inside the parts), `chosen` and `rejected` as
in hone/data/preference.py (a string, or one assistant message).

A pair's prompt is tokenized as for SFT (the chat template, each `<image>` expanded into the
processor's placeholder ids) and shared by both sides, which keep preference.py's layouts: two
rows [2B, L] (chosen rows, then rejected rows) or, with `shared_prompt`, one row [prompt | chosen
| rejected] per pair. Every batch carries the pairs' frames, `pixel_values` [rows, F, 3, tile,
tile] and `pixel_attention_mask` (the same images on a pair's chosen and rejected rows), so the
policy and the reference score both completions against the same images.

Length: a pair is never cut through an image. Over `max_length` (the prompt plus the longer
completion), `overlong="truncate"` cuts the completions from the right when the whole prompt
fits with at least one completion token (`truncated`), else drops the pair
(`dropped_image_cut`); `drop` drops it; `error` stops naming the record. Text-only pairs follow
preference.py's policy (the prompt cut from the left first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hone.data.preference import SIDES, Pair, PairStats, PreferenceData, fit_pair, reply_text
from hone.data.preference import split_reply
from hone.data.sft import Where
from hone.data.vision import (OVERLONG, expand_images, frame_arrays, image_positions, image_refs,
                              load_frames, parse_vision_messages, stack_frames)
from hone.errors import InputError
from hone.models.vision.idefics3_processor import Idefics3ImageSettings


@dataclass(frozen=True)
class VisionPair(Pair):
    """A Pair and its prompt's frames (F = 0 without images)."""
    frames: np.ndarray = field(default_factory=lambda: np.zeros((0, 3, 0, 0), np.float32))
    sizes: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int32))


@dataclass
class VisionPairStats(PairStats):
    images: int = 0
    dropped_image_cut: int = 0
    dropped_records: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in super().as_dict().items() if k != "dropped_records"}


def tokenize_vision_pair(record: dict, tokenizer, *, settings: Idefics3ImageSettings,
                         max_length: int = 2048, max_frames: int | None = None,
                         overlong: str = "truncate", base_dir: str | Path = ".",
                         path: str = "<records>", index: int = 0,
                         stats: VisionPairStats | None = None) -> VisionPair | None:
    """The VisionPair of one record, or None when a policy skips it (module docstring)."""
    stats = VisionPairStats() if stats is None else stats
    where = Where(path, index)
    if overlong not in OVERLONG:
        raise InputError(f"must be one of {', '.join(OVERLONG)}; got {overlong!r}",
                         key="data.overlong")
    messages, inline = parse_vision_messages(where.field(record, "prompt"), where, "prompt")
    refs = image_refs(record, messages, inline, where)
    replies = [reply_text(where.field(record, side), where, side) for side in SIDES]
    split = [split_reply(messages, reply, tokenizer, where) for reply in replies]
    if any(s is None for s in split):
        stats.skipped_empty += 1
        return None
    (prompt, chosen), (other, rejected) = split
    if prompt != other:
        raise where.error("prompt", "the chat template renders this prompt differently before "
                                    "chosen and before rejected, so they cannot share it")
    if chosen == rejected:
        stats.skipped_identical += 1
        return None
    if not refs:  # text only: preference.py's policy
        pair = fit_pair(prompt, chosen, rejected, max_length,
                    "drop" if overlong == "error" else overlong,
                    getattr(tokenizer, "bos_id", None), stats)
        return None if pair is None else VisionPair(pair.prompt, pair.chosen, pair.rejected)
    at = image_positions(prompt, tokenizer, len(refs), where)
    frames, grids = load_frames(refs, settings, base_dir, where)
    prompt = expand_images(prompt, [False] * len(prompt), at, grids, tokenizer,
                           settings.image_seq_len)[0].tolist()
    longest = max(len(chosen), len(rejected))
    too_many = max_frames is not None and len(frames) > max_frames
    if len(prompt) + longest > max_length or too_many:
        what = (f"{len(frames)} frames, over data.max_frames {max_frames}" if too_many else
                f"{len(prompt) + longest} tokens with its images' placeholders, over "
                f"data.max_length {max_length}")
        if overlong == "error":
            raise where.error("prompt", f"{what}; a pair is never cut through an image "
                                        "(data.overlong: drop skips such pairs)")
        room = max_length - len(prompt)
        chosen, rejected = chosen[:room], rejected[:room]
        if overlong == "drop" or too_many or room < 1 or chosen == rejected:
            if overlong == "drop":
                stats.dropped_overlong += 1
            else:
                stats.dropped_image_cut += 1
            stats.dropped_records.append(index)
            return None
        stats.truncated += 1
    stats.kept += 1
    stats.images += len(refs)
    stacked, sizes = stack_frames(frames, settings.tile)
    return VisionPair(*(np.asarray(ids, np.int32) for ids in (prompt, chosen, rejected)),
                      frames=stacked, sizes=sizes)


class VisionPreferenceData(PreferenceData):
    """PreferenceData of pairs with images: the same pairs, layouts, shuffling and exact
    resume, each batch with its pairs' frames (`frames` of them a row, `tile` pixels)."""

    def __init__(self, path: str, tokenizer, *, settings: Idefics3ImageSettings,
                 max_length: int = 2048, max_frames: int | None = None,
                 overlong: str = "truncate", max_records: int | None = None,
                 batch_size: int = 8, seed: int = 0, records: list[dict] | None = None,
                 shared_prompt: bool = False, base_dir: str | Path | None = None):
        base = Path(base_dir) if base_dir is not None else Path(str(path)).parent
        self.tile = settings.tile
        self._kept: list[VisionPair] = []

        def tokenize(record, tok, *, index, stats, **_):
            pair = tokenize_vision_pair(record, tok, settings=settings, max_length=max_length,
                                        max_frames=max_frames, overlong=overlong, base_dir=base,
                                        path=str(path), index=index, stats=stats)
            if pair is not None:
                self._kept.append(pair)
            return pair

        super().__init__(path, tokenizer, max_length=max_length,
                         overlong="drop" if overlong == "error" else overlong,
                         max_records=max_records, batch_size=batch_size, seed=seed,
                         records=records, shared_prompt=shared_prompt,
                         stats=VisionPairStats(), tokenize=tokenize)
        self.format = "conversational with images"
        self.frames = max_frames or max(1, max(len(p.frames) for p in self._kept))
        self.add_pair_arrays(pair_index=np.arange(self.num_pairs, dtype=np.int32))

    def with_pixels(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """A batch (its pairs' `pair_index`; padding pairs have pair_valid 0) with the frames
        of each row: a pair's on its chosen and its rejected row alike."""
        kept = [self._kept[i] if valid else None
                for i, valid in zip(batch["pair_index"].tolist(), batch["pair_valid"].tolist())]
        arrays = frame_arrays(kept, self.frames, self.tile)
        if not self.shared_prompt:  # rows [2B, L]: chosen rows, then rejected rows
            arrays = {key: np.concatenate([value, value]) for key, value in arrays.items()}
        return dict(batch, **arrays)

    def iterator(self, batch_size: int | None = None, seed: int | None = None):
        inner = super().iterator(batch_size, seed)
        outer = inner.transform
        inner.transform = (self.with_pixels if outer is None
                           else lambda batch: self.with_pixels(outer(batch)))
        return inner

    def batches(self, batch_size: int | None = None, max_batches: int | None = None):
        return map(self.with_pixels, super().batches(batch_size, max_batches))


def load_vision_pairs(cfg, tokenizer, log):
    """(training pairs, held-out pairs or None) of a preference config whose model is a
    vision-language one (load_pairs' counterpart; the held-out rows get the training rows'
    room for frames)."""
    from hone.data.vision_loader import image_settings
    from hone.weights.hf_vision import vision_family
    d, source = cfg.data, cfg.model.source
    family = vision_family(source)
    if family != "idefics3":
        raise InputError(f"training on images is built for Idefics3 / SmolVLM so far; this "
                         f"model is {family}", path=source, key="model.source")
    kw = dict(settings=image_settings(source), max_length=d.max_length, overlong=d.overlong,
              max_records=d.max_records, batch_size=cfg.train.batch_size, seed=cfg.train.seed,
              shared_prompt=cfg.dpo.shared_prompt)
    train = VisionPreferenceData(d.path, tokenizer, **kw)
    log(f"data: {train.describe()}")
    held_out = (VisionPreferenceData(d.eval_path, tokenizer, max_frames=train.frames, **kw)
                if d.eval_path else None)
    if held_out is not None:
        log(f"eval data: {held_out.describe()}")
    return train, held_out
