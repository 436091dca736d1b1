"""Idefics3 / SmolVLM image preprocessing and prompt expansion with pillow and numpy only.

The numbers are those of transformers' `Idefics3ImageProcessorPil` (the PIL backend; the
default `Idefics3ImageProcessor` needs torchvision) and the strings those of
`Idefics3Processor`; tests/models/test_idefics3_processor.py checks both. The steps:
1. RGB: transparency composited onto white, other modes converted (uint8, [Y, X, C]).
2. The longest edge resized to `longest_edge` (up or down; the other edge keeps the aspect
   ratio, rounded down, then up to even), and the result kept under 4096 pixels a side.
3. With splitting: both edges resized up to multiples of `tile`, cut into tile x tile crops row
   by row, then the whole image squeezed to one tile as the global view (after the crops). An
   image that fits one tile is its own single frame. Without splitting: one tile x tile frame.
4. uint8 -> float32 (x / 255 in double, then rounded), minus mean, over std, channels first.
5. Every frame of the batch padded with zeros at the bottom and right to the largest frame, and
   every record to the most frames, with a pixel mask of 1 on the real pixels.
Every resize is PIL's on uint8 images (LANCZOS by default), as transformers does it, which is
what makes the pixel values equal rather than close.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

# transformers' Idefics3 MAX_IMAGE_SIZE: no side above this after the first resize.
MAX_SIDE = 4096
FAKE_TOKEN = "<fake_token_around_image>"
IMAGE_TOKEN = "<image>"
GLOBAL_TAG = "<global-img>"


@dataclass(frozen=True)
class Idefics3ImageSettings:
    """What a checkpoint's preprocessor_config.json sets (transformers' names in comments)."""

    longest_edge: int = 4 * 364  # size.longest_edge: the first resize's longest edge
    tile: int = 364  # max_image_size.longest_edge: the side of each crop and of the global view
    split: bool = True  # do_image_splitting: crops plus a global view for large images
    resample: int = int(Image.Resampling.LANCZOS)  # resample: PIL's filter for every resize
    rescale_factor: float = 1 / 255  # rescale_factor
    mean: tuple[float, float, float] = (0.5, 0.5, 0.5)  # image_mean
    std: tuple[float, float, float] = (0.5, 0.5, 0.5)  # image_std
    image_seq_len: int = 169  # the processor's `<image>` tokens per frame (the model's Q)


def to_rgb(image: Image.Image) -> np.ndarray:
    """[Y, X, 3] uint8; transparency is composited onto white."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        rgba = image.convert("RGBA")
        white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return np.array(Image.alpha_composite(white, rgba).convert("RGB"))
    return np.array(image.convert("RGB"))


def resize(image: np.ndarray, height: int, width: int, resample: int) -> np.ndarray:
    """A [Y, X, 3] uint8 image resized by PIL to [height, width, 3]."""
    return np.array(Image.fromarray(image).resize((width, height), resample=resample))


def longest_edge_size(height: int, width: int, longest: int) -> tuple[int, int]:
    """(height, width) with the longest edge at `longest`, then no side above MAX_SIDE."""
    ratio = width / height
    if width >= height:
        width = longest
        height = int(width / ratio)
        height += height % 2
    else:
        height = longest
        width = int(height * ratio)
        width += width % 2
    height, width = max(height, 1), max(width, 1)
    ratio = width / height
    if width >= height and width > MAX_SIDE:
        width, height = MAX_SIDE, int(MAX_SIDE / ratio)
    elif height > width and height > MAX_SIDE:
        height, width = MAX_SIDE, int(MAX_SIDE * ratio)
    return max(height, 1), max(width, 1)


def tile_multiple_size(height: int, width: int, tile: int) -> tuple[int, int]:
    """(height, width) rounded up to multiples of `tile`, the shorter edge via the aspect ratio."""
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return height, width


def frames_of(image: np.ndarray, s: Idefics3ImageSettings) -> tuple[list[np.ndarray], int, int]:
    """One image's frames ([Y, X, 3] uint8 each) and its grid of crops (rows, cols; 0, 0 when
    the image is a single frame)."""
    image = resize(image, *longest_edge_size(*image.shape[:2], s.longest_edge), s.resample)
    if not s.split:
        return [resize(image, s.tile, s.tile, s.resample)], 0, 0
    image = resize(image, *tile_multiple_size(*image.shape[:2], s.tile), s.resample)
    height, width = image.shape[:2]
    if height <= s.tile and width <= s.tile:
        return [image], 0, 0
    rows, cols = (height - s.tile) // s.tile + 1, (width - s.tile) // s.tile + 1
    crops = [image[r * s.tile:(r + 1) * s.tile, c * s.tile:(c + 1) * s.tile]
             for r in range(rows) for c in range(cols)]
    return crops + [resize(image, s.tile, s.tile, s.resample)], rows, cols


def normalize(frame: np.ndarray, s: Idefics3ImageSettings) -> np.ndarray:
    """[Y, X, 3] uint8 -> [3, Y, X] float32: (x * rescale_factor - mean) / std."""
    x = (frame.astype(np.float64) * s.rescale_factor).astype(np.float32)
    mean = np.asarray(s.mean, np.float32)
    std = np.asarray(s.std, np.float32)
    return np.ascontiguousarray(((x - mean) / std).transpose(2, 0, 1))


def preprocess(images: list[list[Image.Image]], s: Idefics3ImageSettings = Idefics3ImageSettings()):
    """Records' images -> dict(pixel_values [B, N, 3, Y, X] float32, pixel_attention_mask
    [B, N, Y, X] int64, grids: per record, (rows, cols) of each image), N the most frames of a
    record. A record without images gets N all-zero frames (padding, as transformers)."""
    frames, grids = [], []
    for record in images:
        record_frames, record_grids = [], []
        for image in record:
            parts, rows, cols = frames_of(to_rgb(image), s)
            record_frames += [normalize(f, s) for f in parts]
            record_grids.append((rows, cols))
        frames.append(record_frames)
        grids.append(record_grids)
    sizes = [f.shape[1:] for record in frames for f in record]
    if not sizes:
        raise ValueError("no images to preprocess")
    height, width = max(y for y, _ in sizes), max(x for _, x in sizes)
    n = max(len(record) for record in frames)
    pixels = np.zeros((len(frames), n, 3, height, width), np.float32)
    mask = np.zeros((len(frames), n, height, width), np.int64)
    for b, record in enumerate(frames):
        for i, f in enumerate(record):
            pixels[b, i, :, :f.shape[1], :f.shape[2]] = f
            mask[b, i, :f.shape[1], :f.shape[2]] = 1
    return {"pixel_values": pixels, "pixel_attention_mask": mask, "grids": grids}


def image_prompt(rows: int, cols: int, image_seq_len: int) -> str:
    """What one `<image>` of a prompt becomes: each crop tagged with its place, a line per row
    of crops, then the global view between fake tokens."""
    placeholders = IMAGE_TOKEN * image_seq_len
    view = f"{FAKE_TOKEN}{GLOBAL_TAG}{placeholders}{FAKE_TOKEN}"
    if rows == 0 and cols == 0:
        return view
    lines = "".join("".join(f"{FAKE_TOKEN}<row_{r + 1}_col_{c + 1}>{placeholders}"
                            for c in range(cols)) + "\n" for r in range(rows))
    return f"{lines}\n{view}"


def expand_prompt(text: str, grids: list[tuple[int, int]], image_seq_len: int) -> str:
    """`text` with its k-th `<image>` replaced by image k's `image_prompt`; the counts must
    agree."""
    parts = text.split(IMAGE_TOKEN)
    if len(parts) - 1 != len(grids):
        raise ValueError(f"the prompt has {len(parts) - 1} {IMAGE_TOKEN} but {len(grids)} "
                         "images were given")
    out = [parts[0]]
    for (rows, cols), rest in zip(grids, parts[1:]):
        out += [image_prompt(rows, cols, image_seq_len), rest]
    return "".join(out)
