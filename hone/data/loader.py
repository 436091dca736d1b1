"""SFT data end to end: records -> examples -> rows -> batches, with a resumable iterator.

`SFTData(path, tokenizer, ...)` does all the Python work once, up front: read the records, tokenize
each (counting what the policies skip in `stats`), then pad or pack into fixed-shape numpy rows
(`hone.data.collate`). Training steps only index those arrays, so no step waits on tokenization.
`data.iterator()` gives the endless shuffled training batches, `data.batches()` the evaluation
batches, `data.describe()` one line for the log.

Design choices:
- Training batches come from a Grain pipeline over the rows:
  `MapDataset.source(rows).shuffle(seed).repeat(None).batch(B, drop_remainder=True)`. Grain
  reshuffles every epoch from the seed and batches the endless stream, so batches run across
  epoch boundaries and every batch is full (static shapes). Its iterator state is one integer,
  so `TrainIterator.get_state()` is a small JSON-safe dict that a checkpoint stores, and
  `set_state` continues with exactly the batches an uninterrupted run would have seen.
- The state also records the number of rows, the batch size and the seed, and `set_state`
  refuses a state from different data or settings instead of silently resuming elsewhere.
- Batches are read in the calling thread, without Grain's thread pool and read-ahead (see
  `TrainIterator`): the rows are already arrays.
- Evaluation reads the rows in order, no shuffle, in ceil(R / B) batches; the last one is filled
  with all-padding rows whose loss_mask is 0, so every row counts exactly once and shapes stay
  static.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import grain
import numpy as np

from hone.data.collate import empty_rows, pack_rows, pad_rows
from hone.data.sft import Example, Stats, check_options, detect_format, tokenize_sft
from hone.data.sources import read_records
from hone.errors import InputError


class SFTData:
    """Tokenized, padded or packed SFT rows of one data path.

    Attributes: `rows` (dict of numpy arrays [R, L], keys as in `hone.data.collate`), `stats`
    (a `Stats`), `format` (the resolved record format), `num_rows`, `max_length`, `pad_id`,
    `batch_size` and `seed` (the defaults of `iterator()` and `batches()`).
    """

    def __init__(self, path: str, tokenizer, *, format: str = "auto", max_length: int = 256,
                 pack: bool = False, loss_on: str = "completion", overlong: str = "truncate",
                 max_records: int | None = None, batch_size: int = 8, seed: int = 0,
                 records: list[dict] | None = None):
        """Read `path` (or use `records`, with `path` naming them in messages) and build rows."""
        check_options(format=format, loss_on=loss_on, max_length=max_length, overlong=overlong)
        self.batch_size = check_batch_size(batch_size)
        self.seed = int(seed)
        self.path = path = str(path)
        self.pack = pack
        records = load_records(path, records, max_records)
        # One format for the whole file, from its first record: a later record missing a field
        # is then reported as exactly that, not as "some other format".
        self.format = detect_format(records[0], path, 0) if format == "auto" else format
        self.stats = Stats()
        self.max_length = max_length
        self.pad_id = int(tokenizer.pad_id)
        examples: list[Example] = []
        for index, record in enumerate(records):
            example = tokenize_sft(record, tokenizer, format=self.format, loss_on=loss_on,
                                   max_length=max_length, overlong=overlong, path=path,
                                   index=index, stats=self.stats)
            if example is not None:
                examples.append(example)
        if not examples:
            raise InputError(f"no record is left to train on ({self.stats})", path=path)
        collate = pack_rows if pack else pad_rows
        self.rows = collate(examples, max_length, self.pad_id)
        self.num_rows = len(self.rows["tokens"])

    @property
    def num_target_tokens(self) -> int:
        """Trained target tokens over all rows (one epoch)."""
        return int(self.rows["loss_mask"].sum())

    def describe(self) -> str:
        """One line for the log: where the rows came from and what the policies did."""
        layout = "packed" if self.pack else "padded"
        return (f"{self.path}: {self.format}, {self.stats}; {self.num_rows} {layout} rows of "
                f"{self.max_length}, {self.num_target_tokens} target tokens per epoch")

    def iterator(self, batch_size: int | None = None, seed: int | None = None) -> TrainIterator:
        """Endless shuffled training batches (see `TrainIterator`); defaults from the constructor."""
        return TrainIterator(self.rows, self.batch_size if batch_size is None else batch_size,
                             self.seed if seed is None else seed)

    def num_batches(self, batch_size: int | None = None) -> int:
        """How many batches `batches()` yields: ceil(num_rows / batch_size)."""
        batch_size = self.batch_size if batch_size is None else check_batch_size(batch_size)
        return math.ceil(self.num_rows / batch_size)

    def batches(self, batch_size: int | None = None,
                max_batches: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Evaluation batches: the rows in order, no shuffle, `num_batches()` of them (at most
        `max_batches`); the last is filled with all-padding rows (loss_mask 0)."""
        batch_size = self.batch_size if batch_size is None else batch_size
        count = self.num_batches(batch_size)
        if max_batches is not None:
            count = min(count, max_batches)
        return ordered_batches(self.rows, batch_size, count,
                               lambda n: empty_rows(n, self.max_length, self.pad_id))


class TrainIterator:
    """Shuffled training batches (dicts of [B, L] arrays) whose position can be saved and restored.

    `next()` -> batch; `get_state()` -> JSON-safe dict; `set_state(state)` continues exactly there.
    The underlying Grain iterator is `grain_iterator` (for `grain.checkpoint` handlers).
    `rows` may hold any arrays with one leading item axis (item i is `{key: value[i]}`), and
    `transform`, if given, reshapes each stacked batch (it holds no state, so resuming is unchanged).
    """

    def __init__(self, rows: dict[str, np.ndarray], batch_size: int, seed: int,
                 transform: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]] | None = None):
        self.batch_size = check_batch_size(batch_size)
        self.seed = int(seed)
        self.transform = transform
        self.num_rows = len(next(iter(rows.values())))
        dataset = (grain.MapDataset.source(_Rows(rows)).shuffle(seed=self.seed).repeat(None)
                   .batch(self.batch_size, drop_remainder=True))
        # Read in the calling thread: a batch is a numpy gather (well under a millisecond per
        # row), while Grain's default 16 threads and 500-batch read-ahead would compete with the
        # train step for CPU and memory. The batches are the same either way.
        self.grain_iterator = iter(dataset.to_iter_dataset(
            grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)))

    def next(self) -> dict[str, np.ndarray]:
        batch = next(self.grain_iterator)
        return batch if self.transform is None else self.transform(batch)

    __next__ = next

    def __iter__(self) -> TrainIterator:
        return self

    def get_state(self) -> dict[str, Any]:
        return {"grain": self.grain_iterator.get_state(), "num_rows": self.num_rows,
                "batch_size": self.batch_size, "seed": self.seed}

    def set_state(self, state: dict[str, Any]) -> None:
        mine = {"num_rows": self.num_rows, "batch_size": self.batch_size, "seed": self.seed}
        theirs = {key: state.get(key) for key in mine} if isinstance(state, dict) else state
        if theirs != mine or "grain" not in state:
            raise InputError(f"the saved data-iterator state is for {theirs}, but this run has "
                             f"{mine}: the data or the batch settings changed since the "
                             "checkpoint, so it cannot resume exactly", key="data_iter")
        self.grain_iterator.set_state(state["grain"])


class _Rows:
    """Random access over the rows: item i is {key: [L] array} (what Grain's batch stacks)."""

    def __init__(self, rows: dict[str, np.ndarray]):
        self._rows = rows
        self._len = len(next(iter(rows.values())))

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        return {key: value[index] for key, value in self._rows.items()}


def load_records(path: str, records: list[dict] | None,
                 max_records: int | None) -> list[dict]:
    """The records at `path` (or the given `records`), at most `max_records`, checked to be a
    non-empty list of dicts (else an InputError naming `path`)."""
    if records is None:
        records = read_records(path, max_records)
    elif max_records is not None:
        records = records[:max_records]
    if not records:
        raise InputError("holds no records", path=path)
    for index, record in enumerate(records):
        if not isinstance(record, dict):
            raise InputError(f"record {index}: expected an object, got {type(record).__name__}",
                             path=path)
    return records


def ordered_batches(rows: dict[str, np.ndarray], batch_size: int, count: int,
                    filler: Callable[[int], dict[str, np.ndarray]],
                    ) -> Iterator[dict[str, np.ndarray]]:
    """The first `count` batches of `rows` in order, unshuffled; a short last batch is completed
    with `filler(missing)` (padding items that carry no loss), so shapes stay static."""
    for k in range(count):
        batch = {key: value[k * batch_size:(k + 1) * batch_size] for key, value in rows.items()}
        short = batch_size - len(batch["tokens"])
        if short:
            padding = filler(short)
            batch = {key: np.concatenate([batch[key], padding[key]]) for key in batch}
        yield batch


def check_batch_size(batch_size: int) -> int:
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"must be a positive integer, got {batch_size!r}", key="train.batch_size")
    return batch_size
