"""KTO data: unpaired examples labelled desirable or undesirable -> two rows each -> batches.

A record is `prompt` + `completion` + `label` (a boolean: true = desirable), in text or
conversational form exactly as preference records are (`hone.data.preference`: the same chat
template policy, the same prompt/completion split). With `from_pairs` a preference record
(`prompt` + `chosen` + `rejected`) gives two examples: the chosen completion desirable, the
rejected one undesirable.

KTO's reference point z0 is estimated from mismatched pairs: a prompt with a completion written
for another prompt. Each example therefore carries a second row, its KL row, [its prompt | the
completion of its partner], and is stored as a `Pair(prompt, completion, partner completion)`,
so `PreferenceData`'s storage, shuffling, exact resume and padded evaluation batches serve it
unchanged. A batch of B examples is

    tokens, targets, loss_mask, attention_mask, positions, segment_ids       [2B, L]
        rows 0..B-1 the examples, B..2B-1 their KL rows (row B+i holds example i's prompt).
    pair_valid                                                                [B] float32
        1 for a real example, 0 for padding (only in the last evaluation batch).
    desirable                                                                 [B] float32
    every array `add_pair_arrays` attached (precomputed reference log-probs)  [B, ...]

Design choices:
- The partner of example i is the next example in the file (cyclically) whose prompt differs
  from i's, fixed when the data is read, as TRL builds its KL completions once, up front. Fixed
  partners make the KL rows' reference log-probs computable in advance ("precomputed"), the
  same in every epoch, and resuming exact. The step averages the KL rows of the whole batch.
- Over-long examples follow data.overlong on the example itself (prompt cut from the left
  first, keeping a leading BOS, then the completion from the right, as for preference pairs);
  a KL row is its prompt and as much of the partner's completion as fits.
- A missing or non-boolean label is an InputError naming the file, record and field.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hone.data.loader import check_batch_size, load_records
from hone.data.preference import (FORMATS, Pair, PairStats, PreferenceData, detect_pair_format,
                                  pair_rows, reply_text, split_reply, tokenize_pair)
from hone.data.sft import Where, check_options, parse_messages
from hone.errors import InputError


@dataclass(frozen=True)
class Example:
    """One tokenized KTO example (the completion excludes the prompt)."""
    prompt: np.ndarray      # int32 [P], P >= 1
    completion: np.ndarray  # int32 [C], C >= 1
    desirable: bool


def tokenize_example(record: dict, tokenizer, *, format: str = "auto", max_length: int = 256,
                     overlong: str = "truncate", path: str = "<records>", index: int = 0,
                     stats: PairStats | None = None) -> Example | None:
    """The Example of one prompt/completion/label record, or None when a policy skips it."""
    stats = PairStats() if stats is None else stats
    where = Where(path, index)
    if format == "auto":
        format = detect_pair_format(record)
    prompt, completion = where.field(record, "prompt"), where.field(record, "completion")
    if "label" not in record:
        hint = (" (this is a preference pair: set data.from_pairs=true)"
                if "chosen" in record else "")
        raise where.error("label", f"missing field: a KTO record needs a boolean label, true = "
                                   f"desirable (fields present: {', '.join(map(repr, record))})"
                                   + hint)
    label = record["label"]
    if not isinstance(label, bool):
        raise where.error("label", f"must be true or false, got {type(label).__name__} "
                                   f"{label!r}")
    if format == "text":
        prompt = where.string(prompt, "prompt")
        completion = where.string(completion, "completion")
    elif format == "conversational":
        if getattr(tokenizer, "chat_template", None) is None:
            raise where.error("prompt", "a list of messages needs a tokenizer with a chat template")
        prompt = parse_messages(prompt, where, "prompt")
        completion = reply_text(completion, where, "completion")
    else:
        raise InputError(f"must be one of {', '.join(FORMATS)}; got {format!r}", key="data.format")
    split = split_reply(prompt, completion, tokenizer, where)
    if split is None or not split[0]:
        stats.skipped_empty += 1
        return None
    return _fit(*split, label, max_length, overlong, getattr(tokenizer, "bos_id", None), stats)


def _fit(prompt: list[int], completion: list[int], desirable: bool, max_length: int,
         overlong: str, bos_id: int | None, stats: PairStats) -> Example | None:
    """The over-long policy (module docstring), and the kept example counted."""
    if len(prompt) + len(completion) > max_length:
        if overlong == "drop":
            stats.dropped_overlong += 1
            return None
        keep = min(len(prompt), max(max_length - len(completion), max_length // 2))  # >= 1
        head = int(prompt[0] == bos_id)  # a leading BOS stays
        prompt = prompt[:head] + prompt[len(prompt) - keep + head:]
        completion = completion[:max_length - len(prompt)]
        stats.truncated += 1
    stats.kept += 1
    return Example(np.asarray(prompt, np.int32), np.asarray(completion, np.int32), desirable)


def from_pair(record: dict, tokenizer, stats: PairStats, **kw) -> list[Example]:
    """The desirable (chosen) and undesirable (rejected) example of one preference record."""
    pair = tokenize_pair(record, tokenizer, stats=stats, **kw)
    if pair is None:
        return []
    return [Example(pair.prompt, pair.chosen, True), Example(pair.prompt, pair.rejected, False)]


def partners(examples: list[Example]) -> list[int]:
    """For each example, the next one (cyclically) whose prompt differs from its own; the next
    one when every prompt is the same. Computed per run of equal consecutive prompts."""
    n = len(examples)
    starts = [i for i in range(n)
              if i == 0 or not np.array_equal(examples[i].prompt, examples[i - 1].prompt)]
    out = [0] * n
    for k, start in enumerate(starts):
        end = starts[k + 1] if k + 1 < len(starts) else n
        partner = (end % n) if len(starts) > 1 else None
        for step in range(1, len(starts)):  # the runs after this one, wrapping around
            candidate = starts[(k + step) % len(starts)]
            if not np.array_equal(examples[candidate].prompt, examples[start].prompt):
                partner = candidate
                break
        for i in range(start, end):
            out[i] = (i + 1) % n if partner is None else partner
    return out


def kl_pairs(examples: list[Example], max_length: int) -> list[Pair]:
    """Each example with its KL row: Pair(prompt, completion, partner's completion cut to fit)."""
    chosen = partners(examples)
    return [Pair(e.prompt, e.completion,
                 examples[j].completion[:max_length - len(e.prompt)])
            for e, j in zip(examples, chosen)]


class KTOData(PreferenceData):
    """Tokenized KTO examples of one data path, each with its KL row (module docstring).

    Attributes as `PreferenceData`'s (`pairs` holds the examples, `num_pairs` counts them),
    plus `num_desirable`, `num_undesirable` and `from_pairs`."""

    def __init__(self, path: str, tokenizer, *, from_pairs: bool = False, max_length: int = 256,
                 overlong: str = "truncate", max_records: int | None = None,
                 batch_size: int = 8, seed: int = 0, records: list[dict] | None = None):
        check_options(max_length=max_length, overlong=overlong)
        self.batch_size = check_batch_size(batch_size)
        self.seed = int(seed)
        self.path = path = str(path)
        self.from_pairs = bool(from_pairs)
        records = load_records(path, records, max_records)
        self.format = detect_pair_format(records[0])
        if from_pairs and "chosen" not in records[0] and "completion" in records[0]:
            raise InputError("record 0 has a completion, not chosen and rejected: for "
                             "prompt/completion/label records set data.from_pairs=false",
                             path=path, key="data.from_pairs")
        self.stats = PairStats()
        self.max_length = max_length
        self.pad_id = int(tokenizer.pad_id)
        kw = dict(format=self.format, max_length=max_length, overlong=overlong, path=path)
        examples: list[Example] = []
        for index, record in enumerate(records):
            if from_pairs:
                examples += from_pair(record, tokenizer, self.stats, index=index, **kw)
            else:
                example = tokenize_example(record, tokenizer, index=index, stats=self.stats, **kw)
                examples += [] if example is None else [example]
        if not examples:
            raise InputError(f"no example is left to train on ({self.stats})", path=path)
        self.shared_prompt = False
        self.pairs = pair_rows(kl_pairs(examples, max_length), max_length, self.pad_id)
        self.pairs["desirable"] = np.array([e.desirable for e in examples], np.float32)
        self.num_pairs = len(examples)
        self.num_desirable = int(self.pairs["desirable"].sum())
        self.num_undesirable = self.num_pairs - self.num_desirable

    @property
    def num_target_tokens(self) -> int:
        """Completion tokens of the examples (not of their KL rows), one epoch."""
        return int(self.pairs["loss_mask"][:, 0].sum())

    def describe(self) -> str:
        source = "preference pairs as KTO examples" if self.from_pairs else "KTO examples"
        return (f"{self.path}: {self.format} {source}, {self.stats}; {self.num_pairs} examples "
                f"({self.num_desirable} desirable, {self.num_undesirable} undesirable), each "
                f"with its KL row, rows of {self.max_length}; {self.num_target_tokens} "
                f"completion tokens per epoch")


def class_balance(n_desirable: int, n_undesirable: int, desirable_weight: float,
                  undesirable_weight: float) -> str | None:
    """A message when λ_D·n_D / (λ_U·n_U) is outside [1, 4/3], the range the KTO paper
    recommends (TRL warns the same); None inside it."""
    if n_desirable == 0 or n_undesirable == 0:
        which = "desirable" if n_desirable == 0 else "undesirable"
        return (f"class balance: the training data has no {which} example; KTO learns from "
                f"one class only")
    ratio = desirable_weight * n_desirable / (undesirable_weight * n_undesirable)
    if 1.0 <= ratio <= 4.0 / 3.0:
        return None
    low = undesirable_weight * n_undesirable / n_desirable
    return (f"class balance: desirable_weight * n_desirable / (undesirable_weight * "
            f"n_undesirable) = {desirable_weight:g} * {n_desirable} / ({undesirable_weight:g} * "
            f"{n_undesirable}) = {ratio:.3g}, outside [1, 4/3], the range the KTO paper "
            f"recommends; with kto.undesirable_weight={undesirable_weight:g}, a "
            f"kto.desirable_weight between {low:.3g} and {low * 4 / 3:.3g} is inside it")


def load_kto(cfg, tokenizer, log):
    """(training examples, held-out examples or None) of a KTO config (`data:`, `train:`)."""
    d = cfg.data
    kw = dict(from_pairs=d.from_pairs, max_length=d.max_length, overlong=d.overlong,
              max_records=d.max_records, batch_size=cfg.train.batch_size, seed=cfg.train.seed)
    train = KTOData(d.path, tokenizer, **kw)
    log(f"data: {train.describe()}")
    held_out = KTOData(d.eval_path, tokenizer, **kw) if d.eval_path else None
    if held_out is not None:
        log(f"eval data: {held_out.describe()}")
    return train, held_out
