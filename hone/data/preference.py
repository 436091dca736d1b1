"""Preference data: `prompt` + `chosen` + `rejected` records -> token pairs -> [2B, L] batches.

A `Pair` is one tokenized record: the `prompt` ids and the ids of each completion (`chosen`,
`rejected`; completions only). `PreferenceData(path, tokenizer, ...)` reads and tokenizes a whole
path up front, as `SFTData` does, and keeps the pairs as a dict of numpy arrays (`pairs`) with one
leading pair axis N. A batch of B pairs feeds ONE forward pass over both completions:

    tokens, targets, loss_mask, attention_mask, positions, segment_ids        [2B, L]
        as in `hone.data.collate`. Rows 0..B-1 are the chosen sequences, B..2B-1 the rejected
        ones; rows i and B+i are one pair and hold identical prompt tokens. loss_mask is 1
        exactly on the targets that are completion tokens, so a row's masked sum of token
        log-probs is its completion's log-probability.
    pair_valid                                                                 [B] float32
        1 for a real pair, 0 for a padding pair (only in the last evaluation batch).
    every array `add_pair_arrays` attached                                     [B, ...]
        e.g. ref_chosen_logp [N] -> [B].

Record formats (decided once, from the first record; every record must then follow it):
- "text": `prompt`, `chosen` and `rejected` are strings. With a chat template the prompt is a user
  turn rendered with the generation prompt and each completion is the assistant reply: its content
  and the end-of-turn token that closes it. Without a template: raw prompt ids, then the completion
  and EOS (as SFT's prompt/completion).
- "conversational" (TRL's): `prompt` is a list of messages; `chosen`/`rejected` are each a string or
  a list of one assistant message.

With `shared_prompt=True` each pair is instead ONE row [prompt | chosen | rejected] whose
prompt is computed once (`hone.data.shared_prefix`: the arrays, the mask and why it is exact);
batches are then [B, S] rows plus [B, 2, K] score arrays, and every array has the pair axis first.

Design choices:
- A plain-text prompt IS put in the chat template here, unlike SFT's prompt/completion. Preference
  tuning follows SFT on a chat model (builtin:arithmetic-pref follows builtin:arithmetic's chat
  `messages`), and the preference must be learned in the format that model answers in.
- Chat tokens come from SFT's `chat_tokens` (its boundary policy: spans found by rendering prefixes,
  each segment tokenized as at inference). The completion is the trained span of the last assistant
  message; the text the template writes after its end-of-turn token (ChatML's newline) is dropped,
  since generation stops there. Both sides must yield the same prompt ids (else an InputError).
- Storage keeps each pair's two rows together ([N, 2, L] per row key), so Grain shuffles pairs,
  never rows, and any per-pair array ([N, ...]) travels with its pair; batches become [2B, L].
  Shuffling, exact resume and padded evaluation batches are `hone.data.loader`'s (as for SFT).

Policies, counted in `PairStats`:
- an empty (whitespace-only) chosen or rejected, or a prompt of no tokens at all (nothing to predict
  the first completion token from): skipped (`skipped_empty`);
- chosen and rejected with the same completion ids: skipped (`skipped_identical`), as the pair
  carries no preference (its DPO gradient is zero);
- longer than `max_length` (the prompt plus the longer completion): `overlong="drop"` skips the pair
  (`dropped_overlong`); `overlong="truncate"` cuts in TRL's order (`truncated`): first the prompt
  from the left, keeping its end (the words next to the answer) and a leading BOS, down to
  max(max_length - longer completion, max_length // 2) tokens (half of the length, TRL's default
  ratio of max_prompt_length to max_length); then both completions from the right to the room left
  (a cut completion loses its end-of-turn token, as in TRL).
  Every side keeps at least one prompt and one completion token (max_length >= 2); a pair whose
  cut completions became identical is dropped (`dropped_overlong`);
- a missing field or a field of the wrong type is an InputError naming file, record and field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

from hone.data.collate import KEYS, empty_rows, pad_rows
from hone.data.loader import TrainIterator, check_batch_size, load_records, ordered_batches
from hone.data.sft import (Example, Stats, Where, chat_tokens, check_options, parse_messages,
                           prompt_completion_tokens)
from hone.data.shared_prefix import ROW_KEYS, SCORE_KEYS, empty_shared, shared_rows
from hone.errors import InputError

FORMATS = ("auto", "text", "conversational")
SIDES = ("chosen", "rejected")


@dataclass(frozen=True)
class Pair:
    """One tokenized preference record; the completions exclude the prompt."""
    prompt: np.ndarray    # int32 [P], P >= 1
    chosen: np.ndarray    # int32 [C], C >= 1
    rejected: np.ndarray  # int32 [R], R >= 1

    def __len__(self) -> int:
        """Length of the longer of the two sequences."""
        return len(self.prompt) + max(len(self.chosen), len(self.rejected))

    def examples(self) -> tuple[Example, Example]:
        """The chosen and the rejected sequence: prompt + completion, targets on the completion."""
        p = len(self.prompt)
        return tuple(Example(np.concatenate([self.prompt, side]), np.arange(p + len(side)) >= p)
                     for side in (self.chosen, self.rejected))


@dataclass
class PairStats(Stats):
    """What happened to the preference records: `Stats`' counts, plus identical pairs."""
    skipped_identical: int = 0  # chosen and rejected tokenize the same: nothing to prefer


def detect_pair_format(record: dict) -> str:
    """'conversational' when `prompt` is a list of messages, else 'text'."""
    return "conversational" if isinstance(record.get("prompt"), list) else "text"


def tokenize_pair(record: dict, tokenizer, *, format: str = "auto", max_length: int = 256,
                  overlong: str = "truncate", path: str = "<records>", index: int = 0,
                  stats: PairStats | None = None) -> Pair | None:
    """The Pair of one record, or None when a policy skips it (counted in `stats`)."""
    stats = PairStats() if stats is None else stats
    where = Where(path, index)
    if format == "auto":
        format = detect_pair_format(record)
    prompt = where.field(record, "prompt")
    replies = [where.field(record, side) for side in SIDES]
    if format == "text":
        prompt = where.string(prompt, "prompt")
        replies = [where.string(reply, side) for reply, side in zip(replies, SIDES)]
    elif format == "conversational":
        if getattr(tokenizer, "chat_template", None) is None:
            raise where.error("prompt", "a list of messages needs a tokenizer with a chat template")
        prompt = parse_messages(prompt, where, "prompt")
        replies = [reply_text(reply, where, side) for reply, side in zip(replies, SIDES)]
    else:
        raise InputError(f"must be one of {', '.join(FORMATS)}; got {format!r}", key="data.format")

    split = [split_reply(prompt, reply, tokenizer, where) for reply in replies]
    if any(s is None for s in split):
        stats.skipped_empty += 1
        return None
    (prompt_ids, chosen), (other_prompt_ids, rejected) = split
    if prompt_ids != other_prompt_ids:
        raise where.error("prompt", "the chat template renders this prompt differently before "
                                    "chosen and before rejected, so they cannot share it")
    if chosen == rejected:
        stats.skipped_identical += 1
        return None
    if not prompt_ids:
        stats.skipped_empty += 1
        return None
    return fit_pair(prompt_ids, chosen, rejected, max_length, overlong,
                getattr(tokenizer, "bos_id", None), stats)


def reply_text(value: Any, where: Where, side: str) -> str:
    """A conversational completion's text: a string, or the content of one assistant message."""
    if isinstance(value, str):
        return value
    messages = parse_messages(value, where, side)
    if len(messages) != 1 or messages[0]["role"] != "assistant":
        raise where.error(side, f"must be a string or a list of one assistant message, got "
                                f"{len(messages)} message(s) starting with role "
                                f"{messages[0]['role']!r}")
    return messages[0]["content"]


def split_reply(prompt: str | list[dict], reply: str, tokenizer,
           where: Where) -> tuple[list[int], list[int]] | None:
    """(prompt ids, completion ids) of one side, or None when the reply is empty."""
    if isinstance(prompt, str) and getattr(tokenizer, "chat_template", None) is None:
        ids, mask = prompt_completion_tokens(prompt, reply, tokenizer, "completion")
    else:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        ids, mask = chat_tokens(messages + [{"role": "assistant", "content": reply}], tokenizer,
                                "completion", where, last_only=True)
    if ids is None:
        return None
    start = mask.index(True)
    end = len(mask) - mask[::-1].index(True)  # the trained span is contiguous
    return ids[:start], ids[start:end]


def fit_pair(prompt: list[int], chosen: list[int], rejected: list[int], max_length: int,
         overlong: str, bos_id: int | None, stats: PairStats) -> Pair | None:
    """Apply the over-long policy (module docstring) and count the kept pair."""
    longest = max(len(chosen), len(rejected))
    if len(prompt) + longest > max_length:
        if overlong == "drop":
            stats.dropped_overlong += 1
            return None
        keep = min(len(prompt), max(max_length - longest, max_length // 2))  # >= 1
        head = int(prompt[0] == bos_id)  # a leading BOS stays: some models need it (Gemma)
        prompt = prompt[:head] + prompt[len(prompt) - keep + head:]
        room = max_length - len(prompt)  # >= 1: keep <= max(max_length - longest, max_length // 2)
        chosen, rejected = chosen[:room], rejected[:room]
        if chosen == rejected:
            stats.dropped_overlong += 1
            return None
        stats.truncated += 1
    stats.kept += 1
    return Pair(*(np.asarray(ids, np.int32) for ids in (prompt, chosen, rejected)))


# ---- storage and batches ---------------------------------------------------------------------

def pair_rows(pairs: Sequence[Pair], length: int, pad_id: int) -> dict[str, np.ndarray]:
    """Pair storage: every collate key [N, 2, length] (axis 1: chosen, rejected), pair_valid [N]."""
    examples = [pair.examples() for pair in pairs]
    chosen, rejected = (pad_rows([e[k] for e in examples], length, pad_id) for k in (0, 1))
    stored = {key: np.stack([chosen[key], rejected[key]], axis=1) for key in KEYS}
    stored["pair_valid"] = np.ones(len(pairs), np.float32)
    return stored


def pair_batch(stacked: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """B stacked pairs -> one batch: row keys [B, 2, L] -> [2B, L] (all chosen rows, then all
    rejected rows); every other per-pair array stays [B, ...]."""
    return {key: np.concatenate([value[:, 0], value[:, 1]]) if key in KEYS else value
            for key, value in stacked.items()}


class PreferenceData:
    """Tokenized preference pairs of one data path, with training and evaluation batches.

    Attributes: `pairs` (dict of numpy arrays with a leading pair axis N; see the module
    docstring), `stats` (a `PairStats`), `format` ('text' or 'conversational'), `num_pairs`,
    `max_length`, `pad_id`, `batch_size` and `seed` (the defaults of `iterator()`/`batches()`),
    and `shared_prompt` (the one-row layout of `hone.data.shared_prefix`).
    """

    def __init__(self, path: str, tokenizer, *, max_length: int = 256, overlong: str = "truncate",
                 max_records: int | None = None, batch_size: int = 8, seed: int = 0,
                 records: list[dict] | None = None, shared_prompt: bool = False,
                 stats: PairStats | None = None, tokenize=None):
        """Read `path` (or use `records`, with `path` naming them in messages) and build pairs.
        tokenize: `tokenize_pair`'s stand-in (its arguments; hone.data.vision_pairs'), with
        `stats` the counts it keeps."""
        check_options(max_length=max_length, overlong=overlong)
        self.batch_size = check_batch_size(batch_size)
        self.seed = int(seed)
        self.path = path = str(path)
        records = load_records(path, records, max_records)
        self.format = detect_pair_format(records[0])
        self.stats = PairStats() if stats is None else stats
        self.max_length = max_length
        self.pad_id = int(tokenizer.pad_id)
        tokenize = tokenize or tokenize_pair
        pairs = [tokenize(record, tokenizer, format=self.format, max_length=max_length,
                          overlong=overlong, path=path, index=index, stats=self.stats)
                 for index, record in enumerate(records)]
        pairs = [pair for pair in pairs if pair is not None]
        if not pairs:
            raise InputError(f"no pair is left to train on ({self.stats})", path=path)
        self.shared_prompt = bool(shared_prompt)
        self.pairs = (shared_rows(pairs, self.pad_id) if self.shared_prompt
                      else pair_rows(pairs, max_length, self.pad_id))
        self.num_pairs = len(pairs)

    def add_pair_arrays(self, **arrays: np.ndarray) -> None:
        """Attach per-pair arrays ([N, ...], in pair order: the order of `batches()`), e.g.
        precomputed reference log-probs; they arrive in every later batch as [B, ...]."""
        for key, value in arrays.items():
            value = np.asarray(value)
            if key in KEYS or key in ROW_KEYS or key in SCORE_KEYS or key == "pair_valid":
                raise ValueError(f"{key!r} is a built-in batch key; pick another name")
            if value.shape[:1] != (self.num_pairs,):
                raise ValueError(f"{key!r} has shape {value.shape}; it needs a leading axis of "
                                 f"{self.num_pairs} (one entry per pair)")
            self.pairs[key] = value

    @property
    def num_target_tokens(self) -> int:
        """Completion tokens over all pairs, both sides (one epoch)."""
        return int(self.pairs["score_mask" if self.shared_prompt else "loss_mask"].sum())

    def describe(self) -> str:
        """One line for the log: where the pairs came from and what the policies did."""
        rows = (f"1 row of {self.pairs['tokens'].shape[1]} (prompt shared)" if self.shared_prompt
                else f"2 rows of {self.max_length}")
        return (f"{self.path}: {self.format} preference pairs, {self.stats}; {self.num_pairs} "
                f"pairs of {rows}, {self.num_target_tokens} completion tokens per epoch")

    def iterator(self, batch_size: int | None = None, seed: int | None = None) -> TrainIterator:
        """Endless batches of shuffled pairs ([2B, L] rows; see `hone.data.loader.TrainIterator`
        for get_state/set_state); defaults from the constructor."""
        return TrainIterator(self.pairs, self.batch_size if batch_size is None else batch_size,
                             self.seed if seed is None else seed,
                             transform=None if self.shared_prompt else pair_batch)

    def num_batches(self, batch_size: int | None = None) -> int:
        """How many batches `batches()` yields: ceil(num_pairs / batch_size)."""
        batch_size = self.batch_size if batch_size is None else check_batch_size(batch_size)
        return math.ceil(self.num_pairs / batch_size)

    def batches(self, batch_size: int | None = None,
                max_batches: int | None = None) -> Iterator[dict[str, np.ndarray]]:
        """Evaluation batches: the pairs in order, no shuffle, `num_batches()` of them (at most
        `max_batches`); the last is completed with padding pairs (pair_valid 0, no targets)."""
        batch_size = self.batch_size if batch_size is None else batch_size
        count = self.num_batches(batch_size)
        if max_batches is not None:
            count = min(count, max_batches)
        batches = ordered_batches(self.pairs, batch_size, count, self._padding)
        return batches if self.shared_prompt else map(pair_batch, batches)

    def _padding(self, count: int) -> dict[str, np.ndarray]:
        """`count` padding pairs: all-padding rows, and zeros in every per-pair array."""
        if self.shared_prompt:
            _, length = self.pairs["tokens"].shape
            padding = empty_shared(count, length, self.pairs["score_index"].shape[2], self.pad_id)
        else:
            rows = empty_rows(2 * count, self.max_length, self.pad_id)
            padding = {key: value.reshape(count, 2, self.max_length)
                       for key, value in rows.items()}
        for key, value in self.pairs.items():
            padding.setdefault(key, np.zeros((count, *value.shape[1:]), value.dtype))
        return padding


def load_pairs(cfg, tokenizer, log, shared_prompt: bool = False):
    """(training pairs, held-out pairs or None) of a preference config (`data:` and `train:`)."""
    d = cfg.data
    kw = dict(max_length=d.max_length, overlong=d.overlong, max_records=d.max_records,
              batch_size=cfg.train.batch_size, seed=cfg.train.seed, shared_prompt=shared_prompt)
    train = PreferenceData(d.path, tokenizer, **kw)
    log(f"data: {train.describe()}")
    held_out = PreferenceData(d.eval_path, tokenizer, **kw) if d.eval_path else None
    if held_out is not None:
        log(f"eval data: {held_out.describe()}")
    return train, held_out
