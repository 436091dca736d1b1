"""Rollouts: sample G completions per prompt from the current policy and lay prompt + completion
out as fixed-shape training rows.

Row layout ([B, L] with L = max_prompt_tokens + max_new_tokens, B = prompts x G, group-major:
rows g*G .. g*G+G-1 are the samples of prompt g):

    tokens          prompt left-padded to P = max_prompt_tokens, completion from slot P on,
                    then padding
    attention_mask  1 on prompt and completion tokens
    positions       0, 1, ... over the real tokens
    targets         tokens shifted left by one (the token each position predicts)
    loss_mask       1 where targets[t] is a completion token (t = P-1 ... P+len-2)
    sampler_logp    the sampler's log-probability of targets[t] (0 elsewhere)

Tree layout (`pack_tree_rows`, GRPO's default): the G samples of a prompt share it, so each
group is ONE row [prompt | sample 1 | ... | sample G] ([groups, P + G·M]: the prompt from slot
0, the samples back to back, padding after; `hone.data.shared_prefix.branch_rows`), and the
model's `branch_ids` mask lets each sample see the prompt and itself only, its positions
continuing from the prompt's end, as in a row of its own (`hone.data.shared_prefix` explains why
that is exact). The per-token arrays are [groups, G, M], token t of sample j at [g, j, t]:
score_index (the slot whose logits predict it), score_targets (the token), loss_mask,
sampler_logp; per-sample arrays are [groups, G].

Design choices:
- The sampler reads the policy's weights as jit arguments (`hone.generate`), so each step's new
  weights reach it without recompiling and without a copy.
- Log-probabilities on both sides are the model's own distribution (temperature 1, no top-k or
  top-p): the sampler-versus-trainer gap then measures only numerics (KV-cache decode versus a
  full forward pass, precision), which is what truncated importance sampling corrects.
- Every shape is static (P, M, B fixed by the config), so the train step compiles once.
- The sampler's seed is a function of the run seed and the step, so a resumed run draws the
  same samples an uninterrupted run would have.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from flax import nnx

from hone.data.shared_prefix import branch_rows
from hone.models.layers import positions_from_mask
from hone.sampling.generate import Completion, generate
from hone.sampling.paged import rollout_engine
from hone.train.state import unflatten


def step_seed(seed: int, step: int, round_: int = 0) -> int:
    """The sampler seed of one generation round of one step (deterministic, so resumable)."""
    return (seed * 1_000_003 + step * 101 + round_) % (2**31 - 1)


def equal_groups(total, group_size: int) -> np.ndarray:
    """[B / G] bool: whether each group's (G consecutive samples or episodes of one prompt)
    rewards are all equal; their group advantages are 0, so they add nothing to GRPO's update."""
    groups = np.asarray(total, np.float64).reshape(-1, group_size)  # [B / G, G]
    return np.all(groups == groups[:, :1], axis=1)


def refill_groups(first, group_size: int, rounds: int, draw, rewards):
    """DAPO dynamic sampling, for single turns and episodes alike: while fewer groups than the
    first round holds have rewards that differ, up to `rounds` further rounds `draw(r)` (r = 1,
    2, ...). rewards(part): a round's rewards [groups x G]. Returns (the rounds played, first
    included; the chosen (round, group) pairs: groups whose rewards differ first, in the order
    played, then groups whose rewards are all equal)."""
    parts, kept, spare = [first], [], []
    need = len(rewards(first)) // group_size
    while True:
        p = len(parts) - 1
        for k, equal in enumerate(equal_groups(rewards(parts[p]), group_size)):
            (spare if equal else kept).append((p, k))
        if len(kept) >= need or p >= rounds:
            return parts, (kept + spare)[:need]
        parts.append(draw(p + 1))


class PolicyView:
    """What both kinds of rollouts (hone/rl/rollouts.py) share: the policy module over given
    weights, from the graph, the trainable template and the frozen rest they were made with."""

    graphdef: object
    template: object
    frozen: object
    placement: object = None  # hone.rl.rollout_devices.RolloutPlacement, or None

    def place_on(self, placement) -> None:
        """Sample on a RolloutPlacement's devices: its frozen weights, the trainable ones sent
        there on each call of `policy`."""
        self.placement, self.frozen = placement, placement.frozen

    def policy(self, params):
        """The policy module over the given weights (shared buffers, no copy; on the rollout's
        own devices when placed there, the weights sent over)."""
        if self.placement is not None:
            params = self.placement.params(params)
        return nnx.merge(self.graphdef, unflatten(self.template, params), self.frozen)


@dataclass
class Samples:
    """One rollout's completions, group-major, before scoring."""

    prompt_ids: list[list[int]]  # [B] prompt token ids (each prompt repeated G times)
    prompt_texts: list[str]
    completions: list[Completion]
    columns: dict[str, list]  # reward columns, aligned with the rows
    group_size: int

    @property
    def texts(self) -> list[str]:
        return [c.text or "" for c in self.completions]

    @property
    def lengths(self) -> list[int]:
        return [len(c.tokens) for c in self.completions]

    def take_groups(self, groups: list[int]) -> Samples:
        """The samples of the given groups, in that order."""
        g = self.group_size
        rows = [r for k in groups for r in range(k * g, (k + 1) * g)]
        return Samples([self.prompt_ids[r] for r in rows], [self.prompt_texts[r] for r in rows],
                       [self.completions[r] for r in rows],
                       {k: [v[r] for r in rows] for k, v in self.columns.items()}, g)

    @staticmethod
    def concat(parts: list[Samples]) -> Samples:
        first = parts[0]
        return Samples([x for p in parts for x in p.prompt_ids],
                       [x for p in parts for x in p.prompt_texts],
                       [x for p in parts for x in p.completions],
                       {k: [x for p in parts for x in p.columns[k]] for k in first.columns},
                       first.group_size)


def sample(model, tokenizer, prompt_ids: list[list[int]], prompt_texts: list[str],
           columns: dict[str, list], *, group_size: int, max_new_tokens: int,
           temperature: float, top_k: int | None, top_p: float | None, seed: int,
           prompt_bucket: int | None = None, cache_dtype: str | None = None,
           engine: str = "static", max_seqs: int | None = None) -> Samples:
    """G completions of each prompt from `model` (its current weights). prompt_bucket: pad
    prompts to at least this many tokens (max_prompt_tokens: one compiled shape per run; the
    static engine's). cache_dtype: the KV cache's ("float32", "bfloat16"; None: the model's).
    engine, max_seqs: `hone.generate`'s (the paged engine keeps max_seqs decoding); "auto":
    `hone.sampling.paged.rollout_engine` picks by backend."""
    g = group_size
    ids = [p for p in prompt_ids for _ in range(g)]
    outs = generate(model, tokenizer, prompt_ids, max_new_tokens=max_new_tokens,
                    temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
                    min_prompt_bucket=max(len(x) for x in prompt_ids) if prompt_bucket is None
                    else prompt_bucket, n=g,  # one prefill per prompt for its G samples
                    cache_dtype=cache_dtype, engine=rollout_engine(engine), max_seqs=max_seqs)
    return Samples(ids, [t for t in prompt_texts for _ in range(g)], outs,
                   {k: [x for x in v for _ in range(g)] for k, v in columns.items()}, g)


def pack_rows(samples: Samples, prompt_tokens: int, new_tokens: int,
              pad_id: int) -> dict[str, np.ndarray]:
    """The [B, L] training rows of a rollout (layout in the module docstring)."""
    b, p = len(samples.completions), prompt_tokens
    length = p + new_tokens
    tokens = np.full((b, length), pad_id, np.int32)
    mask = np.zeros((b, length), np.int32)
    loss_mask = np.zeros((b, length), np.float32)
    sampler_logp = np.zeros((b, length), np.float32)
    for r, (prompt, out) in enumerate(zip(samples.prompt_ids, samples.completions)):
        c = len(out.tokens)
        tokens[r, p - len(prompt):p] = prompt
        tokens[r, p:p + c] = out.tokens
        mask[r, p - len(prompt):p + c] = 1
        loss_mask[r, p - 1:p - 1 + c] = 1.0
        sampler_logp[r, p - 1:p - 1 + c] = out.logprobs
    positions = positions_from_mask(mask)
    targets = np.concatenate([tokens[:, 1:], np.full((b, 1), pad_id, np.int32)], axis=1)
    return {"tokens": tokens, "attention_mask": mask, "positions": positions,
            "targets": targets, "loss_mask": loss_mask, "sampler_logp": sampler_logp}


def pack_tree_rows(samples: Samples, prompt_tokens: int, new_tokens: int,
                   pad_id: int) -> dict[str, np.ndarray]:
    """The [groups, P + G·M] tree rows of a rollout (module docstring): one per prompt group."""
    g, m = samples.group_size, new_tokens
    groups = len(samples.completions) // g
    prompts, answers = [], []
    for k in range(groups):
        prompt = samples.prompt_ids[k * g]
        if any(samples.prompt_ids[k * g + j] != prompt for j in range(g)):
            raise ValueError(f"pack_tree_rows: the samples of group {k} have different prompts")
        prompts.append(prompt)
        answers.append([samples.completions[k * g + j].tokens for j in range(g)])
    rows = branch_rows(prompts, answers, pad_id, prompt_tokens + g * m, m)
    rows["loss_mask"] = rows.pop("score_mask")
    rows["sampler_logp"] = np.zeros((groups, g, m), np.float32)
    for r, out in enumerate(samples.completions):
        rows["sampler_logp"][r // g, r % g, :len(out.logprobs)] = out.logprobs
    return rows


def tree_layout(cfg, shards: int = 1, minibatches: int = 1) -> bool:
    """Whether the update scores tree rows (one per prompt group): asked for by the RL section's
    shared_prompt, and possible unless the groups do not split evenly over the `shards` data
    shards of the mesh, the `minibatches` and their train.grad_accum micro-batches. (A
    reference on devices of its own scores tree rows too.) Never for agent episodes: their
    openings are shared, but what follows differs in length and turns."""
    section = getattr(cfg, cfg.SECTION)
    agent = getattr(cfg, "agent", None)
    if agent is not None and agent.enabled:
        return False
    groups = cfg.train.batch_size // section.group_size
    return section.shared_prompt and groups % (shards * minibatches * cfg.train.grad_accum) == 0


def completion_width(cfg) -> int:
    """M: the completion slots of a rollout row; with an agent, the whole episode after its
    opening (`hone.agents.episode_rows`: L - P), of which the model's turns are a part."""
    section = getattr(cfg, cfg.SECTION)
    if cfg.agent.enabled:
        return cfg.agent.max_episode_tokens - section.max_prompt_tokens
    return section.max_new_tokens


# The per-sample arrays a tree batch may hold: [groups, G, ...] in the batch (so minibatches
# draw whole groups), one row per sample in the losses.
PER_SAMPLE = ("loss_mask", "sampler_logp", "old_logp", "ref_logp", "old_values", "returns",
              "advantages", "scores")


def flat_samples(mb: dict, keys: tuple[str, ...] = PER_SAMPLE) -> dict:
    """A tree batch with its per-sample arrays among `keys` as one row per sample:
    [groups, G, ...] -> [groups·G, ...], sample j of group k at row k·G + j (the rows layout's
    order); every other array as it is."""
    return dict(mb, **{k: mb[k].reshape((-1,) + mb[k].shape[2:]) for k in keys if k in mb})


def tree_width(samples: Samples, new_tokens: int) -> int:
    """The per-sample width M of this rollout's tree rows: its longest completion rounded up to
    a step of a quarter of new_tokens (at least 8 tokens), at most new_tokens. Slots past every
    completion hold only padding, so dropping them changes no number, while a run whose
    completions are shorter than the limit scores shorter rows; the steps bound how many widths
    (compilations of the update) a run meets."""
    step = max(8, -(-new_tokens // 4))
    step = -(-step // 8) * 8
    longest = max(1, max(samples.lengths))
    return min(new_tokens, -(-longest // step) * step)


def completion_stats(samples: Samples, new_tokens: int) -> dict[str, float]:
    """Completion lengths (tokens) and the share that hit the token limit."""
    lengths = np.asarray(samples.lengths, np.float32)
    truncated = [c.finish_reason == "length" for c in samples.completions]
    return {"completion_len_mean": float(lengths.mean()),
            "completion_len_max": float(lengths.max()),
            "completion_len_min": float(lengths.min()),
            "truncated_fraction": float(np.mean(truncated)),
            "token_limit": float(new_tokens)}
