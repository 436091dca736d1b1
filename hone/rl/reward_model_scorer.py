"""Scoring completions with a trained reward model: texts in, one float per completion out.

`RewardModelScorer` is the `reward_model` reward function of `hone.rl.rewards`. Design choices:

- It scores the text `prompt + completion`, plainly concatenated: a chat prompt arrives already
  templated, so the concatenation is what the policy saw followed by what it wrote. (A reward
  model trained by `hone reward` on chat pairs saw the end-of-turn token after the answer; the
  caller decides whether completions carry it.)
- One jitted function, `score_batch`, at module level with the graph definition static and the
  parameters an argument (as `hone.sampling.engine`). Batches are always `batch_size` rows and
  the length is padded to a power of two from 16, capped at `max_length`, so it compiles once per
  length bucket (at most log2(max_length / 16) + 1 shapes) and then only reuses them. `TRACES`
  counts the traces; tests read it.
- A text longer than `max_length` tokens keeps its END (the reward is read at the last token) and
  its leading BOS, if it has one; `truncated` counts such texts.
- A text of no tokens at all gets NaN, which `Rewards` replaces by its fallback for that sample.
"""

from __future__ import annotations

import collections
from functools import partial
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from hone.errors import InputError

# How many times `score_batch` was traced (= compiled); tests read it.
TRACES: collections.Counter = collections.Counter()

_DTYPES = ("float32", "bfloat16")


@partial(jax.jit, static_argnames=("graphdef",))
def score_batch(graphdef, params, tokens, attention_mask):
    """tokens, attention_mask int32 [B, L] (1 = real token) -> rewards float32 [B]."""
    TRACES["score_batch"] += 1
    model = nnx.merge(graphdef, params)
    return model(tokens, attention_mask=attention_mask)


class RewardModelScorer:
    """`fn(prompts, completions, **columns) -> list[float]` backed by a reward model folder."""

    name = "reward_model"
    # The default timeout when the reward spec sets none: the first call of each length bucket
    # compiles, which for a large model takes far longer than a plain Python reward's 30 s.
    timeout_s = 600.0

    def __init__(self, path: str | Path, tokenizer=None, batch_size: int = 16,
                 max_length: int | None = None, dtype: str = "float32"):
        from hone.tokenizer import load_tokenizer
        from hone.weights.hf_reward import load_reward_model
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise InputError(f"must be an integer >= 1, got {batch_size!r}", key="batch_size")
        if dtype not in _DTYPES:
            raise InputError(f"must be one of {', '.join(_DTYPES)}, got {dtype!r}", key="dtype")
        folder = Path(path)
        if not folder.is_dir():
            raise InputError("no such reward model folder", path=str(folder), key="path")
        model = load_reward_model(folder, jnp.dtype(dtype))
        context = model.config.max_position_embeddings
        max_length = min(1024, context) if max_length is None else max_length
        if (not isinstance(max_length, int) or isinstance(max_length, bool)
                or not 2 <= max_length <= context):
            raise InputError(f"must be an integer from 2 to the model's context {context}, got "
                             f"{max_length!r}", key="max_length")
        if tokenizer is None:
            if not (folder / "tokenizer.json").is_file():
                raise InputError(f"{folder} has no tokenizer.json; give the reward model's "
                                 "tokenizer source", key="tokenizer")
            tokenizer = load_tokenizer(folder)
        elif isinstance(tokenizer, (str, Path)):
            try:
                tokenizer = load_tokenizer(tokenizer)
            except InputError as err:
                raise InputError(f"cannot load it: {err}", key="tokenizer") from err
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        self.max_length = max_length
        self.pad_id = int(tokenizer.pad_id if tokenizer.pad_id is not None else 0)
        self.graphdef, self.params = nnx.split(model)
        self.truncated = 0  # texts cut to max_length so far

    def encode(self, text: str) -> list[int]:
        """Token ids of one text, at most max_length (the end kept, and a leading BOS)."""
        from hone.sampling.generate import encode_prompt
        ids = encode_prompt(self.tokenizer, text)  # no second BOS after a templated prompt
        if len(ids) > self.max_length:
            self.truncated += 1
            bos = getattr(self.tokenizer, "bos_id", None)
            head = ids[:1] if bos is not None and ids[0] == bos else []
            ids = head + ids[len(ids) - (self.max_length - len(head)):]
        return ids

    def __call__(self, prompts: list[str], completions: list[str], **columns) -> list[float]:
        from hone.sampling.generate import bucket
        ids = [self.encode(p + c) for p, c in zip(prompts, completions, strict=True)]
        out = np.full(len(ids), np.nan, np.float32)
        todo = [i for i, x in enumerate(ids) if x]  # an empty text stays NaN (-> fallback)
        for start in range(0, len(todo), self.batch_size):
            rows = todo[start:start + self.batch_size]
            length = min(bucket(max(len(ids[i]) for i in rows)), self.max_length)
            tokens = np.full((self.batch_size, length), self.pad_id, np.int32)  # [B, L]
            mask = np.zeros((self.batch_size, length), np.int32)  # [B, L]
            mask[len(rows):, 0] = 1  # padding rows read one pad token: no all-masked softmax
            for r, i in enumerate(rows):
                tokens[r, :len(ids[i])] = ids[i]
                mask[r, :len(ids[i])] = 1
            scores = score_batch(self.graphdef, self.params, tokens, mask)  # [B]
            out[rows] = np.asarray(scores)[:len(rows)]
        return out.tolist()
