"""Examples -> fixed-shape rows: padding (one document per row) or packing (several per row).

Every row has the same length L (= data.max_length) so the train step compiles once. A set of rows
is a dict of numpy arrays, each [R, L] (a batch is the same dict with R = B):

    tokens          int32    model inputs; pad_id where there is no document
    targets         int32    the next token of the same document (tokens shifted left by one);
                             pad_id at each document's last token and on padding
    loss_mask       float32  1 where targets[t] is trained (the Example's loss_mask shifted left)
    attention_mask  int32    1 for real tokens, 0 for padding
    positions       int32    0, 1, 2, ... restarting at every document
    segment_ids     int32    1, 2, ... per document within the row; 0 on padding

Design choices:
- The shift happens here, within each document, so a target never comes from the next packed
  document and the loss needs no special case for document ends.
- Packing is greedy first-fit in input order: each document goes into the first row with room
  for it, else into a new row. Documents never cross rows (they are already at most L long), and
  the model's `segment_ids` mask stops attention across documents, so a packed row computes
  exactly what each document would compute alone.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hone.data.sft import Example

KEYS = ("tokens", "targets", "loss_mask", "attention_mask", "positions", "segment_ids")
_DTYPES = {"tokens": np.int32, "targets": np.int32, "loss_mask": np.float32,
           "attention_mask": np.int32, "positions": np.int32, "segment_ids": np.int32}


def empty_rows(count: int, length: int, pad_id: int) -> dict[str, np.ndarray]:
    """`count` all-padding rows ([count, length] each): no tokens, no targets, no loss."""
    rows = {key: np.zeros((count, length), dtype) for key, dtype in _DTYPES.items()}
    rows["tokens"][:] = pad_id
    rows["targets"][:] = pad_id
    return rows


def pad_rows(examples: Sequence[Example], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """One row per example, right-padded to `length`: arrays [len(examples), length]."""
    rows = empty_rows(len(examples), length, pad_id)
    for r, example in enumerate(examples):
        _place(rows, r, 0, 1, example, length)
    return rows


def pack_rows(examples: Sequence[Example], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Examples packed greedily (first fit, in order) into rows: arrays [R, length]."""
    placements: list[tuple[int, int, int]] = []  # (row, offset, segment) per example
    free = np.zeros(max(len(examples), 1), np.int64)  # room left in each opened row
    used = np.zeros_like(free)                         # documents in each opened row
    n_rows = 0
    for example in examples:
        size = len(example)
        _check_length(size, length)
        fits = np.flatnonzero(free[:n_rows] >= size)
        if fits.size:
            row = int(fits[0])
        else:
            row, n_rows = n_rows, n_rows + 1
            free[row] = length
        used[row] += 1
        placements.append((row, length - int(free[row]), int(used[row])))
        free[row] -= size
    rows = empty_rows(n_rows, length, pad_id)
    for example, (row, offset, segment) in zip(examples, placements):
        _place(rows, row, offset, segment, example, length)
    return rows


def _check_length(size: int, length: int) -> None:
    if not 1 <= size <= length:
        raise ValueError(f"a document of {size} tokens does not fit rows of {length}; "
                         "tokenize_sft truncates or drops to max_length first")


def _place(rows: dict[str, np.ndarray], r: int, offset: int, segment: int, example: Example,
           length: int) -> None:
    n = len(example)
    _check_length(n, length)
    span = slice(offset, offset + n)
    rows["tokens"][r, span] = example.tokens
    # Target of position t is token t+1 of the same document; the last position has none.
    rows["targets"][r, offset:offset + n - 1] = example.tokens[1:]
    rows["loss_mask"][r, offset:offset + n - 1] = example.loss_mask[1:]
    rows["attention_mask"][r, span] = 1
    rows["positions"][r, span] = np.arange(n, dtype=np.int32)
    rows["segment_ids"][r, span] = segment
