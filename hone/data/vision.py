"""Vision-language SFT records -> token ids, loss mask and the images' frames (Idefics3 / SmolVLM).

Record format (TRL's for vision-language data): `messages` whose `content` is a string or a list
of parts, `{"type": "text", "text": ...}` and `{"type": "image"}`, and the record's `images`, one
per image part in order. An image is a path (relative to the data file's folder, or absolute), a
`data:image/...;base64,...` URL, `{"path": ...}` or `{"bytes": ...}` (raw bytes, or base64 text in
JSON), or a PIL image (records built in memory). An image part may instead carry its image itself
(`{"type": "image", "image": ...}`); a record uses one way or the other. Text-only records (no
image part) mix freely with the others.

How a record becomes tokens:
1. The conversation is rendered by the tokenizer's chat template with the parts as they are (a
   vision template writes `<image>` for each image part) and cut into trained and untrained spans
   by hone.data.sft's boundary policy (`chat_tokens`; an assistant message's text is its text
   parts joined).
2. Each image is preprocessed (hone/models/vision/idefics3_processor.py: transformers' numbers),
   and its one `<image>` token is replaced by the ids of its full placeholder text (a tag and
   `image_seq_len` `<image>` tokens per crop, then the global view), so the model's placeholders
   and the image's frames agree by construction. The template must write exactly one `<image>` per
   image part, else the record is an error naming it.
3. Image placeholders never carry loss, wherever they sit.

Length policy: a record is never cut through an image. Over `max_length` tokens:
`overlong="truncate"` keeps the first `max_length` tokens when every image's placeholders end
before the cut (the text after the last image is cut, as for text records) and otherwise drops
the record (`dropped_image_cut`); `overlong="drop"` drops it (`dropped_overlong`);
`overlong="error"` stops with an error naming the record, its length and the limit. A record of
more frames than `max_frames` (a row's room for frames in a batch) follows the same policy
(dropped as `dropped_image_cut`, or the error). Dropped records' indices are kept in
`VisionStats.dropped_records`, so the caller can name them.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
from PIL import Image

from hone.data.collate import pad_rows
from hone.data.sft import ROLES, Example, Stats, Where, chat_tokens
from hone.errors import InputError
from hone.models.vision.idefics3_processor import (IMAGE_TOKEN, Idefics3ImageSettings, frames_of,
                                                   image_prompt, normalize, to_rgb)

OVERLONG = ("truncate", "drop", "error")
LOSS_ON = ("completion", "all")


@dataclass(frozen=True)
class VisionExample(Example):
    """One tokenized record and its images' frames (F = 0 for a text-only record)."""
    frames: np.ndarray = field(default_factory=lambda: np.zeros((0, 3, 0, 0), np.float32))
    # float32 [F, 3, Y, X], Y and X at most the settings' tile (a small single frame is smaller)
    sizes: np.ndarray = field(default_factory=lambda: np.zeros((0, 2), np.int32))
    # int32 [F, 2]: each frame's real height and width (the rest of frames[i] is padding)
    images: int = 0  # images in the record (a split image is several frames)


@dataclass
class VisionStats(Stats):
    """Stats of hone.data.sft plus what images did."""
    images: int = 0             # images in the kept records
    frames: int = 0             # their frames (crops and global views)
    dropped_image_cut: int = 0  # over the length (or frames) under "truncate", with an image cut
    dropped_records: list[int] = field(default_factory=list)  # indices of the dropped records

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in super().as_dict().items() if k != "dropped_records"}


def tokenize_vision_sft(record: dict, tokenizer, *, settings: Idefics3ImageSettings,
                        loss_on: str = "completion", max_length: int = 2048,
                        max_frames: int | None = None, overlong: str = "truncate",
                        base_dir: str | Path = ".", path: str = "<records>", index: int = 0,
                        stats: VisionStats | None = None) -> VisionExample | None:
    """Tokens, loss mask and frames of one record, or None when a policy drops it (counted in
    `stats`; the module docstring has the format and the policies)."""
    stats = VisionStats() if stats is None else stats
    where = Where(path, index)
    if overlong not in OVERLONG:
        raise InputError(f"must be one of {', '.join(OVERLONG)}; got {overlong!r}",
                         key="data.overlong")
    if loss_on not in LOSS_ON:
        raise InputError(f"must be one of {', '.join(LOSS_ON)}; got {loss_on!r}",
                         key="data.loss_on")
    messages, inline = parse_vision_messages(where.field(record, "messages"), where)
    refs = image_refs(record, messages, inline, where)
    ids, mask = chat_tokens(messages, tokenizer, loss_on, where)
    if ids is None:
        stats.skipped_empty += 1
        return None
    at = image_positions(ids, tokenizer, len(refs), where)
    frames, grids = load_frames(refs, settings, base_dir, where)
    tokens, loss, ends = expand_images(ids, mask, at, grids, tokenizer, settings.image_seq_len)
    loss[0] = False  # nothing predicts the first token
    too_many = max_frames is not None and len(frames) > max_frames
    if len(tokens) > max_length or too_many:
        what = (f"{len(frames)} frames, over data.max_frames {max_frames}" if too_many else
                f"{len(tokens)} tokens with its images' placeholders, over data.max_length "
                f"{max_length}")
        if overlong == "error":
            raise where.error("messages", f"{what}; a record is never cut through an image "
                                          "(data.overlong: drop skips such records)")
        if overlong == "drop":
            stats.dropped_overlong += 1
            stats.dropped_records.append(index)
            return None
        if too_many or (ends and ends[-1] > max_length) or not loss[:max_length].any():
            stats.dropped_image_cut += 1
            stats.dropped_records.append(index)
            return None
        tokens, loss = tokens[:max_length], loss[:max_length]
        stats.truncated += 1
    elif not loss.any():
        stats.skipped_empty += 1
        return None
    stats.kept += 1
    stats.images += len(refs)
    stats.frames += len(frames)
    stacked, sizes = stack_frames(frames, settings.tile)
    return VisionExample(tokens, loss, frames=stacked, sizes=sizes, images=len(refs))


def load_frames(refs, settings: Idefics3ImageSettings, base_dir, where: Where):
    """(every frame [3, y, x] float32 of the images `refs` in order, each image's grid)."""
    frames, grids = [], []
    for ref, key in refs:
        parts, rows, cols = frames_of(to_rgb(load_image(ref, base_dir, where, key)), settings)
        frames += [normalize(f, settings) for f in parts]
        grids.append((rows, cols))
    return frames, grids


def image_positions(ids: list[int], tokenizer, count: int, where: Where) -> list[int]:
    """Where the chat template wrote `<image>` in ids; there must be `count` (one per part)."""
    image_id = _single_id(tokenizer, IMAGE_TOKEN, where)
    at = [k for k, t in enumerate(ids) if t == image_id]
    if len(at) != count:
        raise where.error("messages", f"the chat template wrote {len(at)} {IMAGE_TOKEN} tokens "
                                      f"for {count} image part(s); a vision model's template "
                                      "writes one per image part")
    return at


def stack_frames(frames: list[np.ndarray], tile: int) -> tuple[np.ndarray, np.ndarray]:
    """(frames [F, 3, Y, X] zero-padded to the largest, sizes [F, 2] of their real parts)."""
    stacked = (np.stack(_pad_frames(frames)) if frames
               else np.zeros((0, 3, tile, tile), np.float32))
    return stacked, np.asarray([f.shape[1:] for f in frames], np.int32).reshape(-1, 2)


def expand_images(ids: list[int], mask: list[bool], at: list[int], grids, tokenizer,
                  seq_len: int):
    """ids with the <image> token at each of `at` replaced by its image's placeholder ids (no
    loss). Returns (tokens int32, loss bool, the end of each image's placeholders)."""
    tokens: list[int] = []
    loss: list[bool] = []
    ends: list[int] = []
    cache: dict[tuple[int, int], list[int]] = {}
    cursor = 0
    for k, grid in zip(at, grids):
        tokens += ids[cursor:k]
        loss += mask[cursor:k]
        if grid not in cache:
            cache[grid] = tokenizer.encode(image_prompt(*grid, seq_len), add_special_tokens=False)
        tokens += cache[grid]
        loss += [False] * len(cache[grid])
        ends.append(len(tokens))
        cursor = k + 1
    tokens += ids[cursor:]
    loss += mask[cursor:]
    return np.asarray(tokens, np.int32), np.asarray(loss, np.bool_), ends


def _pad_frames(frames: list[np.ndarray]) -> list[np.ndarray]:
    """A record's frames [3, y, x] zero-padded at the bottom and right to its largest."""
    y = max(f.shape[1] for f in frames)
    x = max(f.shape[2] for f in frames)
    return [np.pad(f, ((0, 0), (0, y - f.shape[1]), (0, x - f.shape[2]))) for f in frames]


def _single_id(tokenizer, token: str, where: Where) -> int:
    ids = tokenizer.encode(token, add_special_tokens=False)
    if len(ids) != 1:
        raise where.error("messages", f"the tokenizer has no {token} token (it encodes it as "
                                      f"{len(ids)} tokens): not a vision-language model's")
    return ids[0]


# ---- records ---------------------------------------------------------------------------------

def parse_vision_messages(value: Any, where: Where,
                          name: str = "messages") -> tuple[list[dict], list[tuple[Any, str]]]:
    """(messages for the chat template, the images their parts carry with the field naming
    each): content strings kept, part lists normalised to {"type": "text", "text"} and
    {"type": "image"}; errors name the field (`name`: the record's field holding them)."""
    if not isinstance(value, list) or not value:
        raise where.error(name, f"must be a non-empty list of messages, got "
                                f"{type(value).__name__}")
    out, inline = [], []
    for j, message in enumerate(value):
        at = f"{name}[{j}]"
        if not isinstance(message, dict):
            raise where.error(at, f"must be an object with role and content, got "
                                  f"{type(message).__name__}")
        role = where.field(message, "role", f"{at}.role")
        if role not in ROLES:
            raise where.error(f"{at}.role", f"must be one of {', '.join(ROLES)}, got {role!r}")
        content = where.field(message, "content", f"{at}.content")
        if isinstance(content, list):
            content = [_part(part, where, f"{at}.content[{k}]", inline)
                       for k, part in enumerate(content)]
        elif not isinstance(content, str):
            raise where.error(f"{at}.content", f"must be a string or a list of parts, got "
                                               f"{type(content).__name__}")
        out.append({"role": role, "content": content})
    return out, inline


def _part(part: Any, where: Where, at: str, inline: list) -> dict:
    if not isinstance(part, dict) or part.get("type") not in ("text", "image"):
        raise where.error(f"{at}.type", "a content part is {\"type\": \"text\", \"text\": ...} "
                                        "or {\"type\": \"image\"}")
    if part["type"] == "text":
        return {"type": "text", "text": where.string(where.field(part, "text", f"{at}.text"),
                                                     f"{at}.text")}
    ref = next((part[k] for k in ("image", "path") if part.get(k) is not None), None)
    if ref is not None:
        inline.append((ref, f"{at}.image"))
    return {"type": "image"}


def image_refs(record: dict, messages: list[dict], inline: list,
               where: Where) -> list[tuple[Any, str]]:
    """The record's images in order with the field naming each (its `images`, or those its
    image parts carry: `inline`); their count must be the image parts' of `messages` (as
    parse_vision_messages returns them)."""
    parts = sum(1 for m in messages if isinstance(m["content"], list)
                for p in m["content"] if p["type"] == "image")
    given = record.get("images")
    if given is not None and inline:
        raise where.error("images", "images are given both in the record's images and inside "
                                    "image parts; use one")
    if given is None:
        refs = inline
    elif not isinstance(given, list):
        raise where.error("images", f"must be a list of images, got {type(given).__name__}")
    else:
        refs = [(ref, f"images[{k}]") for k, ref in enumerate(given)]
    if len(refs) != parts:
        raise where.error("images", f"{len(refs)} image(s) for {parts} image part(s) in the "
                                    "messages; each {\"type\": \"image\"} part takes one image")
    return refs


def load_image(ref: Any, base_dir: str | Path, where: Where, key: str) -> Image.Image:
    """A PIL image from a record's reference (the module docstring's forms); errors name the
    record and the field."""
    if isinstance(ref, Image.Image):
        return ref
    if isinstance(ref, dict):
        if ref.get("bytes") is not None:
            ref = ref["bytes"]
            data = ref if isinstance(ref, bytes) else _base64(ref, where, key)
            return _open(data, where, key)
        if ref.get("path") is not None:
            ref = ref["path"]
    if isinstance(ref, bytes):
        return _open(ref, where, key)
    if not isinstance(ref, str):
        raise where.error(key, f"an image is a path, a data URL, {{\"path\"}} or {{\"bytes\"}}; "
                               f"got {type(ref).__name__}")
    if ref.startswith("data:"):
        head, _, body = ref.partition(",")
        if ";base64" not in head:
            raise where.error(key, "a data URL image must be base64 (data:image/...;base64,...)")
        return _open(_base64(body, where, key), where, key)
    file = Path(ref) if Path(ref).is_absolute() else Path(base_dir) / ref
    if not file.is_file():
        raise where.error(key, f"image file not found: {file}")
    return _open(file.read_bytes(), where, key, str(file))


def _base64(text: str, where: Where, key: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as err:
        raise where.error(key, f"not valid base64 ({err})") from err


def _open(data: bytes, where: Where, key: str, name: str = "the embedded bytes") -> Image.Image:
    try:
        image = Image.open(io.BytesIO(data))
        image.load()
    except Exception as err:  # PIL raises several kinds for a bad file
        raise where.error(key, f"{name}: not a readable image ({type(err).__name__}: "
                               f"{err})") from err
    return image


# ---- batches ---------------------------------------------------------------------------------

def pad_vision_rows(examples: Sequence[VisionExample], length: int, pad_id: int, frames: int,
                    tile: int) -> dict[str, np.ndarray]:
    """hone.data.collate's padded rows (one record a row) plus `frame_arrays`: fixed shapes,
    so a train step compiles once. Rows are not packed: a row's frames fill its placeholders."""
    rows = pad_rows(examples, length, pad_id)
    rows.update(frame_arrays(examples, frames, tile))
    return rows


def frame_arrays(examples: Sequence[VisionExample | None], frames: int,
                 tile: int) -> dict[str, np.ndarray]:
    """`pixel_values` [R, frames, 3, tile, tile] float32 and `pixel_attention_mask` [R, frames,
    tile, tile] int32 (1 on each frame's real pixels; all-zero padding frames where a record has
    fewer, and for a None: a padding row)."""
    pixels = np.zeros((len(examples), frames, 3, tile, tile), np.float32)
    mask = np.zeros((len(examples), frames, tile, tile), np.int32)
    for r, example in enumerate(examples):
        if example is None:
            continue
        f, _, y, x = example.frames.shape
        if f > frames or y > tile or x > tile:
            raise ValueError(f"row {r}: {f} frames of {y}x{x} do not fit {frames} of "
                             f"{tile}x{tile}; tokenize_vision_sft drops such records first")
        pixels[r, :f, :, :y, :x] = example.frames
        for i, (fy, fx) in enumerate(example.sizes.tolist()):
            mask[r, i, :fy, :fx] = 1
    return {"pixel_values": pixels, "pixel_attention_mask": mask}
