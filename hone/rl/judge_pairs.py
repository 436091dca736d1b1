"""Online DPO's pairs: a judge's scores of G samples per prompt -> one (chosen, rejected) pair
per prompt, on the host, between sampling and the update.

Design choices:
- Chosen = the best-scored sample, rejected = the worst (the first of equal ones, in sampling
  order); with G = 2 that is simply the higher-scored of the two.
- A prompt whose samples all score the same (a tie, for G = 2) says nothing about which is
  better, so it is no pair: it stays in the batch (static shapes) with `usable` false, which the
  loss masks and `skipped_pairs` counts. A non-finite score makes its prompt unusable too.
- The judge's margin (chosen minus rejected score) is logged over the usable pairs only: ties
  would pull it toward 0 without saying anything about the pairs trained on.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hone.rl.rollout import Samples


@dataclass(frozen=True)
class Pairs:
    """Per prompt, [N] each: the sample indices within its group of the chosen and the rejected
    completion, whether the pair is usable, and the judge's margin (0 where unusable)."""

    chosen: np.ndarray  # [N] int, in 0 .. G-1
    rejected: np.ndarray  # [N] int
    usable: np.ndarray  # [N] bool
    margin: np.ndarray  # [N] float64: score(chosen) - score(rejected)

    def metrics(self) -> dict[str, float]:
        kept = int(self.usable.sum())
        return {"judge_margin": float(self.margin[self.usable].mean()) if kept else 0.0,
                "usable_pairs": float(kept), "skipped_pairs": float(self.usable.size - kept)}


def pick_pairs(scores, group_size: int) -> Pairs:
    """The pair of each prompt from the judge's scores [N·G] (group-major: sample j of prompt
    k at k·G + j, as `hone.rl.rollout.sample` lays them out)."""
    s = np.asarray(scores, np.float64).reshape(-1, group_size)  # [N, G]
    chosen, rejected = np.argmax(s, axis=1), np.argmin(s, axis=1)  # [N] each
    rows = np.arange(s.shape[0])
    best, worst = s[rows, chosen], s[rows, rejected]
    usable = np.isfinite(s).all(axis=1) & (best > worst)
    margin = np.where(usable, best - worst, 0.0)
    return Pairs(chosen, rejected, usable, margin)


def pair_samples(samples: Samples, pairs: Pairs) -> Samples:
    """The chosen and the rejected completion of each prompt, in that order: a `Samples` of
    groups of 2 (`hone.rl.rollout.pack_tree_rows` lays it out as [prompt | chosen | rejected]
    rows)."""
    g = samples.group_size
    rows = [k * g + int(j) for k in range(len(pairs.chosen))
            for j in (pairs.chosen[k], pairs.rejected[k])]
    return Samples([samples.prompt_ids[r] for r in rows], [samples.prompt_texts[r] for r in rows],
                   [samples.completions[r] for r in rows],
                   {k: [v[r] for r in rows] for k, v in samples.columns.items()}, 2)
