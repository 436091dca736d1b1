"""Perplexity on text: token-weighted mean negative log-likelihood over records, and its exp.

Design choices:
- The records are read and tokenized exactly as SFT reads its held-out set (`hone.data.loader.
  SFTData` with `loss_on="completion"`), and scored by SFT's own eval loss (`sft_step_loss`
  under `make_eval_step`, summed by `summed_eval`, averaged by `sft_eval_means`). So the number is
  the `eval_loss` / `eval_ppl` a `hone sft` run logs on the same data, and what is scored
  follows the record format: `text` records score every token (and the EOS that SFT appends),
  `messages` and `prompt` + `completion` records score only the completion tokens.
- Token-weighted: the total NLL over all scored tokens divided by their number, so a long record
  weighs more than a short one (the per-token perplexity, not a mean of per-record ones).
- SFT pads every row to `max_length`; here the rows are cut back to the longest real row
  (rounded up to a power of two from 16) before the forward pass: the same numbers for a
  fraction of the compute when records are short.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

from hone.errors import InputError

SCORED = {"text": "all tokens", "messages": "completion tokens",
          "prompt_completion": "completion tokens"}


@dataclass
class PerplexityReport:
    nll: float          # token-weighted mean negative log-likelihood (nats per token)
    perplexity: float   # exp(nll)
    tokens: int         # scored tokens
    records: int        # records scored
    format: str         # record format: text, messages or prompt_completion
    scored: str         # "all tokens" or "completion tokens"
    truncated: int      # records cut to max_length
    skipped: int        # records with nothing to score (empty, or nothing left after the cut)

    def as_dict(self) -> dict:
        return dict(self.__dict__)


def perplexity(model, tokenizer, path: str, *, records: list[dict] | None = None,
               max_length: int = 512, batch_size: int = 8,
               max_records: int | None = None) -> PerplexityReport:
    """Score the records at `path` (or `records`, with `path` naming them in messages)."""
    from flax import nnx

    from hone.data.collate import empty_rows
    from hone.data.loader import SFTData, ordered_batches
    from hone.train.build import summed_eval
    from hone.train.sft_objective import sft_eval_means, sft_step_loss
    from hone.sampling.generate import bucket
    from hone.train.state import flatten, split_model
    from hone.train.step import make_eval_step

    context = model.config.max_position_embeddings
    if not isinstance(max_length, int) or not 2 <= max_length <= context:
        raise InputError(f"must be an integer from 2 to the model's context of {context} "
                         f"tokens, got {max_length!r}", key="--max-length")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"must be a positive integer, got {batch_size!r}", key="--batch-size")
    data = SFTData(path, tokenizer, max_length=max_length, loss_on="completion",
                   overlong="truncate", max_records=max_records, batch_size=batch_size,
                   records=records)
    length = min(bucket(int(data.rows["attention_mask"].sum(axis=1).max())), max_length)
    rows = {key: value[:, :length] for key, value in data.rows.items()}  # [R, length]
    count = data.num_batches()
    # summed_eval reads batches from an object's batches(): these are SFTData's, trimmed.
    trimmed = SimpleNamespace(batches=lambda: ordered_batches(
        rows, batch_size, count, lambda n: empty_rows(n, length, data.pad_id)))

    graphdef, params, frozen = split_model(model, nnx.Param)
    eval_step = make_eval_step(graphdef, params, sft_step_loss)
    sums = summed_eval(eval_step, frozen, trimmed, means=lambda t: {**t, **sft_eval_means(t)})
    result = sums(flatten(params))
    return PerplexityReport(
        nll=float(result["eval_loss"]), perplexity=float(result["eval_ppl"]),
        tokens=int(round(result["eval_target_tokens"])), records=data.stats.kept,
        format=data.format, scored=SCORED[data.format], truncated=data.stats.truncated,
        skipped=data.stats.skipped_empty + data.stats.dropped_overlong)
