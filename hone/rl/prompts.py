"""RL prompts: records with a `prompt` (and the columns rewards read) -> token ids, batched by a
resumable iterator.

Design choices:
- Prompts are tokenized once, up front, like SFT rows: a step only indexes arrays. Each prompt is
  wrapped in the chat template as a user message (`chat=True`), or used as raw text.
- The iterator yields record indices (Grain shuffle over `{"index": i}` rows, the same
  `TrainIterator` SFT uses), so its state is one small dict in the checkpoint and a resumed run
  draws exactly the prompts an uninterrupted one would.
- A prompt longer than `max_prompt_tokens` is dropped (counted) or keeps its last tokens
  (`overlong="truncate"`), where the question and the generation prompt are.
- Every record keeps its other fields as reward columns (`answer`, ...); a record without a
  string `prompt` is an error naming the file, the record and the field.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hone.chat_template import ChatTemplateError
from hone.data.loader import TrainIterator, load_records
from hone.errors import InputError
from hone.sampling.generate import encode_prompt


def prompt_text(tokenizer, prompt: str, chat: bool) -> str:
    """The text the policy continues: the prompt as a chat user turn, or as is."""
    if chat:
        return tokenizer.apply_chat_template([{"role": "user", "content": prompt}],
                                             add_generation_prompt=True)
    return prompt


class PromptData:
    """Tokenized prompts of one data path. `ids[i]` (list of ints), `texts[i]` (templated text),
    `columns` (field -> list aligned with the prompts), `num_prompts`, `dropped`."""

    def __init__(self, path: str, tokenizer, *, max_prompt_tokens: int, chat: bool = True,
                 overlong: str = "drop", max_records: int | None = None,
                 records: list[dict] | None = None):
        self.path = str(path)
        records = load_records(self.path, records, max_records)
        self.ids: list[list[int]] = []
        self.texts: list[str] = []
        self.records: list[dict[str, Any]] = []
        self.dropped = self.truncated = 0
        for index, record in enumerate(records):
            prompt = record.get("prompt")
            if not isinstance(prompt, str) or not prompt.strip():
                raise InputError(f"record {index}: field 'prompt' must be a non-empty string, "
                                 f"got {prompt!r}"[:300], path=self.path)
            try:
                text = prompt_text(tokenizer, prompt, chat)
            except ChatTemplateError as err:
                raise InputError(f"record {index}: the chat template rejects this prompt "
                                 f"({err.detail})", path=self.path, key="prompt") from err
            ids = encode_prompt(tokenizer, text)
            if len(ids) > max_prompt_tokens:
                if overlong == "drop":
                    self.dropped += 1
                    continue
                ids = ids[-max_prompt_tokens:]
                self.truncated += 1
            self.ids.append(ids)
            self.texts.append(text)
            self.records.append(record)
        if not self.ids:
            raise InputError(f"no prompt fits in {max_prompt_tokens} tokens "
                             f"({self.dropped} dropped): raise max_prompt_tokens", path=self.path)
        self.num_prompts = len(self.ids)
        keys = sorted({k for r in self.records for k in r if k != "prompt"})
        self.columns = {k: [r.get(k) for r in self.records] for k in keys}

    def describe(self) -> str:
        lengths = [len(x) for x in self.ids]
        return (f"{self.path}: {self.num_prompts} prompts ({self.dropped} dropped, "
                f"{self.truncated} truncated), {min(lengths)}-{max(lengths)} tokens")

    def iterator(self, batch_size: int, seed: int) -> TrainIterator:
        """Endless shuffled batches {"index": [N, 1] prompt indices} (into `ids`, `texts`,
        `columns`; `select` reads them). The checkpointed state is Grain's position and the
        sizes, never a key name, so a run saved when the key was "tokens" resumes the same."""
        rows = {"index": np.arange(self.num_prompts, dtype=np.int64)[:, None]}
        return TrainIterator(rows, batch_size, seed)

    def select(self, indices) -> tuple[list[list[int]], list[str], dict[str, list]]:
        """(token ids, texts, columns) of the prompts at `indices`."""
        idx = [int(i) for i in np.asarray(indices).reshape(-1)]
        return ([self.ids[i] for i in idx], [self.texts[i] for i in idx],
                {k: [v[i] for i in idx] for k, v in self.columns.items()})


def load_prompts(cfg, section, tokenizer, log):
    """(training prompts, held-out prompts or None) of an RL config (`data:` and its `grpo:` or
    `ppo:` section)."""
    d = cfg.data
    kw = dict(max_prompt_tokens=section.max_prompt_tokens, chat=section.chat,
              overlong=d.overlong)
    train = PromptData(d.path, tokenizer, max_records=d.max_records, **kw)
    log(f"data: {train.describe()}")
    held_out = None
    if d.eval_path:
        held_out = PromptData(d.eval_path, tokenizer, max_records=section.eval_prompts, **kw)
        log(f"eval data: {held_out.describe()}")
    return train, held_out
