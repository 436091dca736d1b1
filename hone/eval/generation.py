"""Prompts in, completions out, for the evaluations that generate (accuracy, compare).

Design choices:
- Prompts are read by RL's `PromptData`: each record's `prompt` goes into the model's chat
  template as a user turn (raw text when the tokenizer has no template), and the other fields
  (`answer`, ...) stay as columns. A prompt too long to leave room for `max_new_tokens` keeps
  its end (where the question and the generation prompt are), counted in `truncated`.
- Batched: `batch_size` rows per `hone.generate` call, every call padded to the bucket of the
  longest prompt of the whole set (`min_prompt_bucket`), so the set compiles one or two shapes.
- Row r of a call samples from its own random stream; call c uses seed `seed + c`, so the
  samples depend on the seed and the batch size, and on nothing else.
"""

from __future__ import annotations

from hone.errors import InputError


def load_prompts(tokenizer, path: str, *, context: int, max_new_tokens: int,
                 limit: int | None = None, records: list[dict] | None = None):
    """A `hone.rl.prompts.PromptData` of at most `limit` records, each prompt cut to leave room
    for `max_new_tokens` in a context of `context` tokens."""
    from hone.rl.prompts import PromptData
    if not isinstance(max_new_tokens, int) or not 1 <= max_new_tokens < context:
        raise InputError(f"must be an integer from 1 to {context - 1} (the model's context is "
                         f"{context} tokens), got {max_new_tokens!r}", key="--max-new-tokens")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise InputError(f"must be a positive integer, got {limit!r}", key="--limit")
    chat = getattr(tokenizer, "chat_template", None) is not None
    return PromptData(path, tokenizer, max_prompt_tokens=context - max_new_tokens, chat=chat,
                      overlong="truncate", max_records=limit, records=records)


def complete(model, tokenizer, prompts: list[list[int]], *, max_new_tokens: int,
             temperature: float = 0.0, seed: int = 0, batch_size: int = 32, n: int = 1) -> list:
    """n `hone.sampling.generate.Completion`s per prompt (token ids), prompt by prompt; a call
    samples about batch_size rows (whole prompts, each prefilled once for its n samples)."""
    from hone.sampling.generate import bucket, generate
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"must be a positive integer, got {batch_size!r}", key="--batch-size")
    longest = bucket(max(len(p) for p in prompts))  # what an unpadded call would pick
    per_call = max(1, batch_size // n)
    out = []
    for call, start in enumerate(range(0, len(prompts), per_call)):
        out += generate(model, tokenizer, prompts[start:start + per_call],
                        max_new_tokens=max_new_tokens, temperature=temperature, seed=seed + call,
                        min_prompt_bucket=longest, n=n)
    return out
