"""Preference pairs with the prompt scored once: one row [prompt | chosen | rejected] per pair.

Chosen and rejected share their prompt, and under causal attention the prompt's hidden states do
not depend on what follows, so two rows (prompt + chosen, prompt + rejected) compute the prompt
twice. Here each pair is one row of the three spans back to back, and the model's `branch_ids`
mask keeps the answers apart: the chosen tokens see the prompt and themselves, the rejected
tokens the prompt and themselves (never the chosen ones), and each answer's positions continue
from the prompt's end, as they would in a row of its own. So every token's hidden state is the
one the two-row layout computes, and the log-probabilities agree to float rounding (a test holds
the two layouts to 1e-5).

The language-model head then runs only where a completion token is predicted: `score_index`
lists those slots (the last prompt token predicts the first token of both answers), so the
[B, T, V] logits of the prompt are never formed either.

Arrays of one batch of B pairs (`shared_rows` stores N pairs the same way):

    tokens, positions, attention_mask, segment_ids, branch_ids      [B, S]  int32
        branch_ids: 0 on the prompt (and padding), 1 on the chosen, 2 on the rejected tokens;
        segment_ids: 1 on the pair's tokens, 0 on padding (as in `hone.data.collate`).
    score_index, score_targets                                       [B, 2, K]  int32
    score_mask                                                       [B, 2, K]  float32
        side 0 chosen, side 1 rejected: token j of that answer is score_targets[:, side, j],
        predicted by the logits at slot score_index[:, side, j]; score_mask is 1 on real tokens.
    pair_valid                                                       [B]  float32

S is the longest prompt + chosen + rejected and K the longest answer, each rounded up to a
multiple of 8 (fewer shapes to compile), unless given.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

ROW_KEYS = ("tokens", "positions", "attention_mask", "segment_ids", "branch_ids")
SCORE_KEYS = ("score_index", "score_targets", "score_mask")
_ROUND = 8


def _round_up(n: int) -> int:
    return max(_ROUND, -(-n // _ROUND) * _ROUND)


def shared_sizes(pairs: Sequence) -> tuple[int, int]:
    """(S, K): the row length and the answer width the pairs need, rounded up to 8."""
    row = max(len(p.prompt) + len(p.chosen) + len(p.rejected) for p in pairs)
    width = max(max(len(p.chosen), len(p.rejected)) for p in pairs)
    return _round_up(row), _round_up(width)


def empty_shared(count: int, length: int, width: int, pad_id: int) -> dict[str, np.ndarray]:
    """`count` padding pairs: no tokens, nothing scored, pair_valid 0."""
    out = {key: np.zeros((count, length), np.int32) for key in ROW_KEYS}
    out["tokens"][:] = pad_id
    out["score_index"] = np.zeros((count, 2, width), np.int32)
    out["score_targets"] = np.full((count, 2, width), pad_id, np.int32)
    out["score_mask"] = np.zeros((count, 2, width), np.float32)
    out["pair_valid"] = np.zeros(count, np.float32)
    return out


def shared_rows(pairs: Sequence, pad_id: int, length: int | None = None,
                width: int | None = None) -> dict[str, np.ndarray]:
    """N pairs (objects with int arrays `prompt`, `chosen`, `rejected`) -> the arrays above with
    a leading pair axis N. `length`/`width` default to `shared_sizes(pairs)`."""
    need_s, need_k = shared_sizes(pairs)
    length = need_s if length is None else length
    width = need_k if width is None else width
    if length < need_s or width < need_k:
        raise ValueError(f"shared_rows: the pairs need rows of {need_s} and answers of {need_k} "
                         f"tokens; got {length} and {width}")
    out = empty_shared(len(pairs), length, width, pad_id)
    out["pair_valid"][:] = 1.0
    for n, pair in enumerate(pairs):
        p = len(pair.prompt)
        if p < 1:
            raise ValueError("shared_rows: a pair needs at least one prompt token")
        start = p
        for side, (branch, answer) in enumerate(((1, pair.chosen), (2, pair.rejected))):
            a = len(answer)
            out["tokens"][n, start:start + a] = answer
            out["positions"][n, start:start + a] = p + np.arange(a)
            out["branch_ids"][n, start:start + a] = branch
            # Token j is predicted at the slot before it: the prompt's last token for j = 0.
            out["score_index"][n, side, :a] = np.concatenate([[p - 1], start + np.arange(a - 1)])
            out["score_targets"][n, side, :a] = answer
            out["score_mask"][n, side, :a] = 1.0
            start += a
        out["tokens"][n, :p] = pair.prompt
        out["positions"][n, :p] = np.arange(p)
        out["attention_mask"][n, :start] = 1
        out["segment_ids"][n, :start] = 1
    return out
