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


def branch_rows(prompts: Sequence, answers: Sequence[Sequence], pad_id: int, length: int,
                width: int) -> dict[str, np.ndarray]:
    """N rows [prompt | answer 1 | ... | answer A], the prompt from slot 0 and the answers back
    to back, padding after: the row keys ([N, length]) and score_index, score_targets and
    score_mask ([N, A, width]) of the module docstring, answer a on branch a + 1. Every row
    has the same number A of answers; an empty answer is scored nowhere."""
    count, branches = len(prompts), len(answers[0]) if len(answers) else 0
    out = _empty(count, branches, length, width, pad_id)
    for n, (prompt, row_answers) in enumerate(zip(prompts, answers)):
        p = len(prompt)
        used = p + sum(len(a) for a in row_answers)
        if p < 1 or len(row_answers) != branches or used > length or max(
                map(len, row_answers), default=0) > width:
            raise ValueError(f"branch_rows: row {n} (a {p}-token prompt and answers of "
                             f"{[len(a) for a in row_answers]} tokens) needs a prompt token, "
                             f"{branches} answers of at most {width} and {used} <= {length} slots")
        out["tokens"][n, :p], out["positions"][n, :p] = prompt, np.arange(p)
        start = p
        for side, answer in enumerate(row_answers):
            a = len(answer)
            if not a:
                continue
            out["tokens"][n, start:start + a] = answer
            out["positions"][n, start:start + a] = p + np.arange(a)
            out["branch_ids"][n, start:start + a] = side + 1
            # Token j is predicted at the slot before it: the prompt's last token for j = 0.
            out["score_index"][n, side, :a] = np.concatenate([[p - 1], start + np.arange(a - 1)])
            out["score_targets"][n, side, :a] = answer
            out["score_mask"][n, side, :a] = 1.0
            start += a
        out["attention_mask"][n, :start] = 1
        out["segment_ids"][n, :start] = 1
    return out


def _empty(count: int, branches: int, length: int, width: int,
           pad_id: int) -> dict[str, np.ndarray]:
    """`count` all-padding rows of `branches` answers: no tokens, nothing scored."""
    out = {key: np.zeros((count, length), np.int32) for key in ROW_KEYS}
    out["tokens"][:] = pad_id
    out["score_index"] = np.zeros((count, branches, width), np.int32)
    out["score_targets"] = np.full((count, branches, width), pad_id, np.int32)
    out["score_mask"] = np.zeros((count, branches, width), np.float32)
    return out


def empty_shared(count: int, length: int, width: int, pad_id: int) -> dict[str, np.ndarray]:
    """`count` padding pairs: no tokens, nothing scored, pair_valid 0."""
    return dict(_empty(count, 2, length, width, pad_id),
                pair_valid=np.zeros(count, np.float32))


def shared_rows(pairs: Sequence, pad_id: int, length: int | None = None,
                width: int | None = None) -> dict[str, np.ndarray]:
    """N pairs (objects with int arrays `prompt`, `chosen`, `rejected`) -> the arrays above with
    a leading pair axis N. `length`/`width` default to `shared_sizes(pairs)`."""
    need_s, need_k = shared_sizes(pairs)
    length = need_s if length is None else length
    width = need_k if width is None else width
    out = branch_rows([p.prompt for p in pairs], [(p.chosen, p.rejected) for p in pairs],
                      pad_id, length, width)
    out["pair_valid"] = np.ones(len(pairs), np.float32)
    return out


def work_tokens(batch: dict) -> int:
    """The tokens a batch stands for, the same in either layout: each sequence's prompt + answer,
    as a row of its own holds them. Rows without `branch_ids` count their attention mask; a
    shared-prefix row [prompt | answer 1 | ... | answer A] counts its prompt once per answer
    (A = score_index.shape[1], an empty answer too, as its own row would still hold the prompt),
    so tokens/s and MFU measure the same work with `shared_prompt` on or off."""
    mask = np.asarray(batch["attention_mask"]) > 0                            # [N, S]
    if "branch_ids" not in batch:
        return int(mask.sum())
    prompt = int((mask & (np.asarray(batch["branch_ids"]) == 0)).sum())     # once per row
    answers = batch["score_index"].shape[1]
    return int(mask.sum()) - prompt + answers * prompt
