"""Reward-model pairwise accuracy: how often score(chosen) > score(rejected), and by how much.

Design choices:
- Pairs are read and tokenized by `PreferenceData`, as `hone reward` reads its held-out pairs
  (the prompt as a chat user turn, each completion as the assistant reply with its end-of-turn
  token; raw prompt + completion + EOS without a template), and the same policies apply
  (identical or empty pairs skipped, over-long ones truncated). Accuracy and margin are the
  recipe's (`hone.recipes.reward.make_reward_loss`: chosen > rejected strictly, chosen -
  rejected), so they equal the run's logged eval_accuracy and eval_margin on the same pairs.
- Scores are kept per pair (the recipe only sums them), from the jitted forward of RL's reward
  scorer (`score_batch`); rows are cut back to the longest real row, rounded up to a power of
  two from 16, before the forward pass.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hone.errors import InputError


@dataclass
class PairsReport:
    accuracy: float         # fraction of pairs with score(chosen) > score(rejected)
    margin: float           # mean of score(chosen) - score(rejected)
    chosen_reward: float    # mean score of the chosen completions
    rejected_reward: float  # mean score of the rejected completions
    pairs: int              # pairs scored
    truncated: int = 0      # pairs cut to max_length
    skipped: int = 0        # pairs with nothing to compare (identical or empty completions)
    chosen: list[float] = field(default_factory=list)    # per pair
    rejected: list[float] = field(default_factory=list)  # per pair

    def as_dict(self) -> dict:
        keys = ("accuracy", "margin", "chosen_reward", "rejected_reward", "pairs", "truncated",
                "skipped")
        return {k: getattr(self, k) for k in keys}


def pair_scores(model, data) -> tuple[np.ndarray, np.ndarray]:
    """(chosen scores [N], rejected scores [N]) of a RewardModel on a PreferenceData."""
    from flax import nnx

    from hone.data.collate import KEYS
    from hone.rl.reward_model_scorer import score_batch
    from hone.sampling.generate import bucket
    length = min(bucket(int(data.pairs["attention_mask"].sum(axis=-1).max())), data.max_length)
    graphdef, params = nnx.split(model)
    chosen, rejected = [], []
    for batch in data.batches():
        rows = {k: batch[k][:, :length] for k in KEYS}  # [2B, length]: B chosen, B rejected
        mask = rows["attention_mask"].copy()
        mask[:, 0] = 1  # padding pairs read one pad token: no all-masked softmax (dropped below)
        scores = np.asarray(score_batch(graphdef, params, rows["tokens"], mask))  # [2B]
        half, valid = len(scores) // 2, batch["pair_valid"] > 0
        chosen.append(scores[:half][valid])
        rejected.append(scores[half:][valid])
    return np.concatenate(chosen), np.concatenate(rejected)


def pair_accuracy(model, tokenizer, path: str, *, records: list[dict] | None = None,
                  max_length: int = 512, batch_size: int = 8,
                  limit: int | None = None) -> PairsReport:
    """Score every pair at `path` (or `records`) with a RewardModel."""
    from hone.data.preference import PreferenceData
    context = model.config.max_position_embeddings
    if not isinstance(max_length, int) or not 2 <= max_length <= context:
        raise InputError(f"must be an integer from 2 to the reward model's context of {context} "
                         f"tokens, got {max_length!r}", key="--max-length")
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise InputError(f"must be a positive integer, got {limit!r}", key="--limit")
    if not isinstance(batch_size, int) or batch_size < 1:
        raise InputError(f"must be a positive integer, got {batch_size!r}", key="--batch-size")
    data = PreferenceData(path, tokenizer, max_length=max_length, max_records=limit,
                          batch_size=batch_size, records=records)
    chosen, rejected = pair_scores(model, data)
    s = data.stats
    return PairsReport(
        accuracy=float(np.mean(chosen > rejected)), margin=float(np.mean(chosen - rejected)),
        chosen_reward=float(np.mean(chosen)), rejected_reward=float(np.mean(rejected)),
        pairs=len(chosen), truncated=s.truncated,
        skipped=s.skipped_empty + s.skipped_identical + s.dropped_overlong,
        chosen=chosen.tolist(), rejected=rejected.tolist())
