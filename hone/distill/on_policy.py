"""On-policy distillation (GKD, Agarwal et al. 2024): with probability lmbda a batch's completions
are replaced by the student's own samples, and the teacher's distribution is distilled on them;
otherwise the batch's data completions are used (supervised KD).

This is the loop's `prepare` hook: it runs on the host before each step, with the student's
current weights (the sampler takes them as jit arguments: no recompilation, no copy), on the
rollout engine the RL recipes sample with (`distill.engine`, `distill.max_seqs`). The coin
and the sampler seed are functions of (train.seed, step), so a resumed run makes the same
choices and draws the same samples as an uninterrupted one.

Prompts come from the padded data rows: the tokens before the first trained target. A row with no
trained target (never produced by the training iterator) is kept as it is.
"""

from __future__ import annotations

import numpy as np

from hone.data.collate import pad_rows
from hone.data.sft import Example
from hone.rl.rollout import step_seed


def split_prompts(batch: dict) -> list[list[int] | None]:
    """The prompt token ids of each padded row (None when the row trains no token)."""
    out = []
    for tokens, mask in zip(np.asarray(batch["tokens"]), np.asarray(batch["loss_mask"])):
        trained = np.flatnonzero(mask > 0)
        # loss_mask[t] trains token t + 1: the completion starts right after position trained[0].
        out.append(None if trained.size == 0 else tokens[:trained[0] + 1].tolist())
    return out


class OnPolicy:
    """prepare(state, batch, step) -> (batch with student completions or as given, host metrics)."""

    def __init__(self, cfg, tokenizer, student_of, max_length: int, pad_id: int):
        self.d, self.seed = cfg.distill, cfg.train.seed
        self.tokenizer, self.student_of = tokenizer, student_of
        self.max_length, self.pad_id = max_length, pad_id  # rows are padded (config rule)

    def coin(self, step: int) -> bool:
        return bool(np.random.default_rng([self.seed, step]).random() < self.d.lmbda)

    def __call__(self, state: dict, batch: dict, step: int) -> tuple[dict, dict]:
        from hone.sampling.generate import generate
        from hone.sampling.paged import rollout_engine
        if not self.coin(step):
            return batch, {"on_policy": 0.0}
        prompts = split_prompts(batch)
        real = [p for p in prompts if p is not None]
        room = self.max_length - max(len(p) for p in real) if real else 0
        new_tokens = min(self.d.max_new_tokens, room)
        if new_tokens < 1:
            return batch, {"on_policy": 0.0}
        outs = iter(generate(
            self.student_of(state["params"]), self.tokenizer, real, max_new_tokens=new_tokens,
            temperature=self.d.gen_temperature, seed=step_seed(self.seed, step),
            min_prompt_bucket=self.max_length, engine=rollout_engine(self.d.engine),
            max_seqs=self.d.max_seqs))
        rows, lengths = [], []
        for i, prompt in enumerate(prompts):
            if prompt is None:
                rows.append(None)
                continue
            completion = next(outs).tokens
            lengths.append(len(completion))
            tokens = np.asarray(prompt + completion, np.int32)
            mask = np.zeros(len(tokens), bool)
            mask[len(prompt):] = True
            rows.append(Example(tokens, mask))
        built = pad_rows([r for r in rows if r is not None], self.max_length, self.pad_id)
        out = {key: np.array(value) for key, value in batch.items()}
        j = 0
        for i, r in enumerate(rows):
            if r is not None:
                for key in built:
                    out[key][i] = built[key][j]
                j += 1
        return out, {"on_policy": 1.0, "sampled_len": float(np.mean(lengths))}
