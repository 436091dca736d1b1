"""Episodes as training rows: one row per episode, the loss on the model's tokens only.

Row layout ([B, L] with L = agent.max_episode_tokens, P = max_prompt_tokens):

    tokens          the opening left-padded to P, the rest of the episode (model turns and
                    environment turns alike) from slot P on, then padding
    attention_mask  1 on the episode's tokens
    segment_ids     1 on the first segment (the opening and what follows it), 2, 3, ... on
                    each later one (`Episode.segments`: the conversation rendered again where
                    the template rewrote earlier turns), 0 on padding: a segment attends to
                    itself only, so each is scored on what the model saw while sampling it
    positions       0, 1, ... over each segment's tokens
    targets         tokens shifted left by one (the token each position predicts)
    loss_mask       1 where targets[t] is a token the model sampled (`Episode.model_mask`):
                    the opening, tool results, environment messages and template tokens
                    between turns get no loss
    sampler_logp    the sampler's log-probability of targets[t] where loss_mask is 1, else 0
    turn_index      the model turn (0, 1, ...) targets[t] belongs to, -1 elsewhere

This is `hone.rl.rollout.pack_rows`'s layout with a completion of C = L - P slots that holds
the whole episode after its opening: the RL losses, the sampler-versus-trainer gap and TIS
read `loss_mask` and `sampler_logp` as they do for one completion, so they cover the model's
tokens of every turn and nothing else. An episode that never started (its environment failed
to reset) is one padding token that nothing scores.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from hone.agents.episode import Episode


def episode_rows(episodes: Sequence[Episode], prompt_tokens: int, length: int,
                 pad_id: int) -> dict[str, np.ndarray]:
    """The [B, length] training rows of a batch of episodes (module docstring)."""
    b, p = len(episodes), prompt_tokens
    tokens = np.full((b, length), pad_id, np.int32)
    mask = np.zeros((b, length), np.int32)
    model = np.zeros((b, length), np.float32)
    logp = np.zeros((b, length), np.float32)
    turn = np.full((b, length), -1, np.int32)
    segment = np.zeros((b, length), np.int32)
    positions = np.zeros((b, length), np.int32)
    for r, ep in enumerate(episodes):
        if not ep.tokens:  # never started: one token, nothing scored
            tokens[r, p - 1], mask[r, p - 1], segment[r, p - 1] = pad_id, 1, 1
            continue
        n, rest = ep.prompt_len, len(ep.tokens) - ep.prompt_len
        if n > p or p + rest > length:
            raise ValueError(f"episode_rows: episode {r} ({n} opening + {rest} tokens) does not "
                             f"fit {p} + {length - p} slots")
        start = p - n
        tokens[r, start:p + rest] = ep.tokens
        mask[r, start:p + rest] = 1
        model[r, start:p + rest] = ep.model_mask
        logp[r, start:p + rest] = ep.logprobs
        ends = np.asarray(ep.turn_ends, np.int64) + start
        slots = np.arange(start, p + rest)
        which = np.searchsorted(ends, slots)  # the turn whose span a slot's token lies in
        turn[r, start:p + rest] = np.where(model[r, start:p + rest] > 0, which, -1)
        bounds = [0] + list(ep.segments) + [len(ep.tokens)]
        for s, (a, z) in enumerate(zip(bounds[:-1], bounds[1:])):
            segment[r, start + a:start + z] = s + 1
            positions[r, start + a:start + z] = np.arange(z - a)
    shift = lambda x, fill: np.concatenate(  # noqa: E731 - slot t holds what t+1 holds
        [x[:, 1:], np.full((b, 1), fill, x.dtype)], axis=1)
    return {"tokens": tokens, "attention_mask": mask, "positions": positions,
            "segment_ids": segment,
            "targets": shift(tokens, pad_id), "loss_mask": shift(model, 0.0),
            "sampler_logp": shift(logp, 0.0), "turn_index": shift(turn, -1)}



def turn_arrays(episodes: Sequence[Episode], rows: dict[str, np.ndarray], gamma: float,
                turn_gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """PPO's per-turn rewards and discounts over `episode_rows`' slots, both [B, L]:
    turn_rewards holds each model turn's reward at the slot that predicts the turn's last token;
    discount is `gamma` (per token) from each model token to the next one, times `turn_gamma`
    (agent.gamma) from a turn's last token to the next turn's first (`gae_over_mask` skips the
    environment's tokens in between)."""
    turn = rows["turn_index"]
    rewards = np.zeros(turn.shape, np.float32)
    discount = np.full(turn.shape, gamma, np.float32)
    for r, ep in enumerate(episodes):
        slots = np.nonzero(turn[r] >= 0)[0]
        for t, reward in enumerate(ep.rewards):
            mine = slots[turn[r, slots] == t]
            if len(mine):
                rewards[r, mine[-1]] = reward
                discount[r, mine[-1]] = gamma * turn_gamma
    return rewards, discount
