"""`hone.agents.rollout`: multi-turn episodes, token in and token out, with the KV cache carried
over between turns.

One episode is one token sequence: the opening prompt (the environment's first messages through
the chat template), then model turn, environment turn, model turn, ... The model's tokens are
kept exactly as sampled (never decoded and encoded again) with the sampler's log-probability of
each; the environment's messages are rendered with the chat template (`hone.agents.render`) and
appended as tokens. `model_mask` is 1 on sampled tokens only.

How a batch of episodes runs: on the rollout engine (hone/sampling/scheduler.py), each
example's opening is one request whose G samples are its episodes (sharing the opening's pages
when the G openings are the same; else one request per episode). When a model turn ends (an end
token, `max_new_tokens`), the engine hands it to the episode's environment here, and the
environment's rendered answer is appended into the episode's own pages; the next turn samples
from there. No turn encodes the history again, an episode that ends frees its place for the
next waiting one, and an episode waiting for its environment holds no place.

Templates that rewrite earlier turns (Qwen3 drops the reasoning of replies before a new user
query; with enable_thinking false, every earlier reply's empty think block): after such a turn
the episode cannot grow as one sequence, so it starts a new segment. The whole conversation is
rendered again with the generation prompt (`opening_text`), appended to the episode's tokens as
tokens the model did not sample (`Episode.segments` records where), and the next turn is
sampled from it alone, as a new engine request (its pages are new; the earlier segment's are
freed). Each segment is then exactly what the model saw while it sampled; the training row holds
the segments one after the other, each attending to itself only (hone/agents/episode_rows.py).
The environment's messages in such a turn count against `max_env_tokens` by their content's
tokens. Each rendering again costs the row its length: budget `max_episode_tokens` for it.

Limits: each episode's tokens stay within `max_episode_tokens` (and `max_after_opening` after
its opening): a turn that would go past it is cut there and the episode ends (`limit =
"max_episode_tokens"`). Tool results longer than `max_tool_tokens` are cut, marked, and counted;
an environment turn longer than `max_env_tokens` ends the episode. Positions are the tokens'
own (no padding between turns), so sliding-window models need no window beyond the model's.

Robustness: a factory or reset that raises leaves its episode empty (no tokens, the fallback
reward); a step that raises ends its episode with the fallback reward; a reset or step that runs
past `env_timeout_s` is interrupted (SIGALRM raises inside it; the rollout must run in the main
thread for that, else there is no limit) and treated the same; each is counted in
`Episode.events` and never stops the batch. Tool calls themselves run inside the environment
(`hone.agents.environment.ToolEnvironment`: worker processes that are killed on a timeout).

Randomness: the sampler's keys come from `seed`: token t after the opening of copy j of example
i is drawn with fold_in(fold_in(fold_in(key(seed), i), j), t) (t counting the environment's
tokens too; when the G openings differ, each episode is a request of its own and its sample 0
draws with fold_in(fold_in(fold_in(fold_in(key(seed), i), j), 0), t); segment s >= 1 of an
episode whose first segment's request key is K and sample index j draws token t of its own with
fold_in(fold_in(fold_in(K, SEGMENT_FOLD + s), j), t)), and each environment is
seeded with `episode_seed(seed, example, copy)` before its reset: the episodes are a function of
the weights, the examples and the seed only, not of how many run at once (exact resume).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
from jax.random import fold_in

from hone.agents.episode import Episode, Switch, episode_seed
from hone.agents.render import supports_tools
from hone.agents.turns import Live, Restart, after_model_turn, start_episode
from hone.errors import InputError
from hone.sampling.requests import Request, Sample, Turn
from hone.sampling.scheduler import PagedEngine


def _check(max_turns, max_new_tokens, max_episode_tokens, max_tool_tokens, max_env_tokens,
           group_size, context):
    for key, value in (("max_turns", max_turns), ("max_new_tokens", max_new_tokens),
                       ("max_episode_tokens", max_episode_tokens),
                       ("max_tool_tokens", max_tool_tokens), ("max_env_tokens", max_env_tokens),
                       ("group_size", group_size)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InputError(f"must be a positive integer, got {value!r}", key=key)
    if max_episode_tokens > context:
        raise InputError(f"{max_episode_tokens} exceeds the model's context of {context}",
                         key="max_episode_tokens")
    if max_new_tokens >= max_episode_tokens:
        raise InputError(f"max_new_tokens {max_new_tokens} leaves no room for an opening within "
                         f"max_episode_tokens {max_episode_tokens}", key="max_episode_tokens")


def rollout(model, tokenizer, factory: Callable, examples: Sequence[dict], *, max_turns: int = 4,
            max_new_tokens: int = 64, max_episode_tokens: int = 1024, max_tool_tokens: int = 256,
            max_env_tokens: int | None = None, temperature: float = 1.0,
            top_k: int | None = None, top_p: float | None = None, seed: int = 0,
            group_size: int = 1, prompt_bucket: int | None = None,
            max_opening_tokens: int | None = None, cache_dtype=None,
            eos_ids: Sequence[int] | None = None,
            env_timeout_s: float | None = 60.0,
            max_after_opening: int | None = None, max_seqs: int | None = None,
            page_size: int = 64, policy_version: int = 0,
            switch: Switch | None = None, template_args: dict | None = None) -> list[Episode]:
    """Play `group_size` episodes of each example (example-major: episode i·G + j is copy j of
    example i) with `model`'s current weights; see the module docstring.

    factory: any callable returning a fresh Environment (a class works). max_env_tokens: the
    tokens an environment turn may add (default max_tool_tokens + 64): a longer one ends the
    episode (`limit = "max_env_tokens"`). prompt_bucket: pad openings to at least this many
    tokens (the engine's prefill rounds lengths up to its own buckets: accepted, not needed).
    max_opening_tokens: a longer opening does not start
    (counted as `openings_too_long`; default max_episode_tokens - max_new_tokens).
    env_timeout_s: the time one reset or step may take (None: no limit).
    max_after_opening: an episode's tokens after its opening at most, cut as max_episode_tokens
    cuts (the training row's slots after the opening, L - P: an opening shorter than P leaves
    room within max_episode_tokens that the row does not have). max_seqs: episodes running at
    once on the engine (default all, at most 64); page_size: its KV pages' slots.
    policy_version: the version `model` is recorded as (Episode.versions); switch: new weights
    from a turn on (see `Switch`). template_args: keyword arguments of the chat template for
    every rendering (e.g. {"enable_thinking": False} for Qwen3)."""
    cfg = model.config
    max_env_tokens = max_env_tokens or -(-(max_tool_tokens + 64) // 16) * 16
    _check(max_turns, max_new_tokens, max_episode_tokens, max_tool_tokens, max_env_tokens,
           group_size, cfg.max_position_embeddings)
    if switch is not None and not 1 <= switch.turn < max_turns:
        raise InputError(f"the new weights' first turn must lie within the episode's turns "
                         f"(1 to {max_turns - 1}), got {switch.turn}", key="switch_turn")
    if not examples:
        return []
    g = group_size
    native = supports_tools(tokenizer)
    lives: list[Live] = []
    openings: list[list[int] | None] = []
    for i, example in enumerate(examples):
        for j in range(g):
            live, ids = start_episode(
                factory, dict(example), episode_seed(seed, i, j), tokenizer, native,
                max_opening_tokens or max_episode_tokens - max_new_tokens, env_timeout_s,
                template_args)
            lives.append(live)
            openings.append(ids)
    if top_k is not None:
        top_k = min(top_k, cfg.vocab_size)
    if eos_ids is None:
        eos_ids = tuple(getattr(tokenizer, "eos_ids", ()) or ())
    eos_set = set(int(e) for e in eos_ids)
    key = jax.random.key(seed)
    # One request per example whose G openings are the same (its episodes share the opening's
    # pages), else one per episode; owners[r][k]: the episode of sample k of request r.
    requests, owners = [], []
    for i in range(len(examples)):
        first = openings[i * g]
        if first is not None and all(openings[i * g + j] == first for j in range(g)):
            groups = [(fold_in(key, i), list(range(i * g, i * g + g)))]
        else:
            groups = [(fold_in(fold_in(key, i), j), [i * g + j]) for j in range(g)
                      if openings[i * g + j] is not None]
        for k, episodes in groups:
            opening = openings[episodes[0]]
            room = max_episode_tokens if max_after_opening is None else min(
                max_episode_tokens, len(opening) + max_after_opening)
            requests.append(Request(opening, room - len(opening), k, n=len(episodes),
                                    turn_tokens=max_new_tokens, policy_version=policy_version))
            owners.append(episodes)
            for j, e in enumerate(episodes):
                live = lives[e]
                live.key = live.segment_key = k
                live.sample, live.budget, live.cap = j, room - len(opening), room
                live.prompt_end = len(opening)
    for live in lives:
        live.version = policy_version

    def play(model, requests, owners) -> None:
        segments = _Segments(len(requests))

        def on_turn(turn: Turn) -> list[int] | None:
            e = owners[turn.request][turn.sample] if turn.request < len(owners) else \
                segments.owners[turn.request]
            live = lives[e]
            cut = turn.room == 0 and turn.reason == "length" and len(turn.tokens) < max_new_tokens
            more = after_model_turn(live, turn.tokens, turn.logprobs, eos_set, tokenizer,
                                    live.ep.turns, max_turns, live.cap, max_tool_tokens,
                                    max_env_tokens, env_timeout_s, cut=cut)
            if more is not None and switch is not None and live.version != switch.version \
                    and live.ep.turns >= switch.turn:
                live.paused = True  # its next turn waits for the new weights
                return None
            if isinstance(more, Restart):  # a new segment: a request of its own
                segments.add(e, Request(list(more), live.budget, live.segment_key,
                                        turn_tokens=max_new_tokens,
                                        policy_version=live.version, first_sample=live.sample))
                return None
            return more

        engine = PagedEngine(model, max_seqs=max_seqs or min(64, sum(r.n for r in requests)),
                             max_len=max(len(r.prompt) + r.max_new_tokens for r in requests),
                             page_size=page_size, cache_dtype=cache_dtype)
        engine.run(requests, temperature=temperature, top_k=top_k, top_p=top_p,
                   eos_ids=tuple(eos_set), on_turn=on_turn, feed=segments)
        for e in segments.lost:
            lives[e].fail("render_errors")

    if requests:
        play(model, requests, owners)
    paused = [e for e, live in enumerate(lives) if live.paused]
    if paused:  # the rest of their turns under the new weights, from their histories
        later, owners = [], []
        for e in paused:
            live, ep = lives[e], lives[e].ep
            live.paused, live.version = False, switch.version
            n = live.prompt_end  # the running segment's prompt, then what it has after it
            so_far = Sample(tokens=ep.tokens[n:], logprobs=ep.logprobs[n:],
                            model_mask=ep.model_mask[n:], turns=ep.turns)
            later.append(Request(ep.tokens[live.start:n], live.budget, live.segment_key,
                                 turn_tokens=max_new_tokens, policy_version=switch.version,
                                 first_sample=live.sample,
                                 resume=(so_far,) if so_far.tokens else None))
            owners.append([e])
        play(switch.model(), later, owners)
    return [live.ep for live in lives]


class _Segments:
    """The engine's feed (hone.sampling.requests.Feed) of new segments' requests: `add` queues
    one while the engine runs (from the turn callback), the next poll hands it over; closed
    whenever nothing is queued (the engine then ends once nothing runs)."""

    def __init__(self, first_index: int):
        self.next, self.pending = first_index, []
        self.owners: dict[int, int] = {}  # request index -> episode
        self.lost: list[int] = []  # episodes whose segment the engine could not hold

    def add(self, episode: int, request: Request) -> None:
        self.owners[self.next] = episode
        self.pending.append((self.next, request))
        self.next += 1

    def poll(self, wait: bool):
        out, self.pending = self.pending, []
        return out or None

    def tokens(self, index, sample, tokens, logprobs) -> None:
        pass

    def finished(self, index, sample, out) -> None:
        pass

    def refused(self, index, error) -> None:
        self.lost.append(self.owners[index])
