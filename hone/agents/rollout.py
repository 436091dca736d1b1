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
draws with fold_in(fold_in(fold_in(fold_in(key(seed), i), j), 0), t)), and each environment is
seeded with `episode_seed(seed, example, copy)` before its reset: the episodes are a function of
the weights, the examples and the seed only, not of how many run at once (exact resume).
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
from jax.random import fold_in

from hone.agents.deadline import EnvTimeout, deadline
from hone.agents.episode import Episode, Switch, episode_seed
from hone.agents.render import after_turn_text, opening_text, supports_tools, with_tools
from hone.errors import InputError
from hone.sampling.generate import encode_prompt
from hone.sampling.requests import Request, Sample, Turn
from hone.sampling.scheduler import PagedEngine

CUT_MARK = "\n[cut: {n} more tokens]"


class _Live:
    """Host-side state of one episode while it runs."""

    def __init__(self, env, example: dict):
        self.env, self.example = env, example
        self.ep = Episode()
        self.history: list[dict] = []  # the conversation as rendered (tools described)
        self.extra: dict = {}
        self.active = False
        self.version = 0  # the policy version sampling its turns now
        self.paused = False  # waits for the new weights (`Switch`) before its next turn
        self.key, self.sample = None, 0  # its request's key and its sample index there
        self.budget = 0  # its request's max_new_tokens

    def fail(self, event: str) -> None:
        self.ep.count(event)
        self.ep.reward = float(getattr(self.env, "fallback_reward", 0.0) or 0.0)
        self.active = False


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


def _cut_tools(tokenizer, messages: list[dict], max_tool_tokens: int, ep: Episode) -> list[dict]:
    """Tool messages whose content is over max_tool_tokens tokens, cut there and marked."""
    out = []
    for m in messages:
        content = m.get("content")
        if m.get("role") == "tool" and isinstance(content, str):
            ids = tokenizer.encode(content, add_special_tokens=False)
            if len(ids) > max_tool_tokens:
                m = dict(m, content=tokenizer.decode(ids[:max_tool_tokens])
                         + CUT_MARK.format(n=len(ids) - max_tool_tokens))
                ep.count("tool_tokens_cut")
        out.append(m)
    return out


def _messages(step) -> list[dict]:
    msgs = list(getattr(step, "messages", None) or [])
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
        raise TypeError("Step.messages must be a list of {'role': ..., 'content': ...} objects")
    return msgs


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
            switch: Switch | None = None) -> list[Episode]:
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
    from a turn on (see `Switch`)."""
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
    lives: list[_Live] = []
    openings: list[list[int] | None] = []
    for i, example in enumerate(examples):
        for j in range(g):
            live, ids = _start(factory, dict(example), episode_seed(seed, i, j), tokenizer,
                               native, max_opening_tokens or max_episode_tokens - max_new_tokens,
                               env_timeout_s)
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
                lives[e].key, lives[e].sample, lives[e].budget = k, j, room - len(opening)
    for live in lives:
        live.version = policy_version

    def play(model, requests, owners) -> None:
        def on_turn(turn: Turn) -> list[int] | None:
            live = lives[owners[turn.request][turn.sample]]
            cap = live.ep.prompt_len + requests[turn.request].max_new_tokens
            cut = turn.room == 0 and turn.reason == "length" and len(turn.tokens) < max_new_tokens
            more = _after_model_turn(live, turn.tokens, turn.logprobs, eos_set, tokenizer,
                                     live.ep.turns, max_turns, cap, max_tool_tokens,
                                     max_env_tokens, env_timeout_s, cut=cut)
            if more is not None and switch is not None and live.version != switch.version \
                    and live.ep.turns >= switch.turn:
                live.paused = True  # its next turn waits for the new weights
                return None
            return more

        engine = PagedEngine(model, max_seqs=max_seqs or min(64, sum(r.n for r in requests)),
                             max_len=max(len(r.prompt) + r.max_new_tokens for r in requests),
                             page_size=page_size, cache_dtype=cache_dtype)
        engine.run(requests, temperature=temperature, top_k=top_k, top_p=top_p,
                   eos_ids=tuple(eos_set), on_turn=on_turn)

    if requests:
        play(model, requests, owners)
    paused = [e for e, live in enumerate(lives) if live.paused]
    if paused:  # the rest of their turns under the new weights, from their histories
        later, owners = [], []
        for e in paused:
            live, ep = lives[e], lives[e].ep
            live.paused, live.version = False, switch.version
            n = ep.prompt_len
            so_far = Sample(tokens=ep.tokens[n:], logprobs=ep.logprobs[n:],
                            model_mask=ep.model_mask[n:], turns=ep.turns)
            later.append(Request(ep.tokens[:n], live.budget, live.key,
                                 turn_tokens=max_new_tokens, policy_version=switch.version,
                                 first_sample=live.sample, resume=(so_far,)))
            owners.append([e])
        play(switch.model(), later, owners)
    return [live.ep for live in lives]


def _start(factory, example: dict, seed: int, tokenizer, native: bool, room: int,
           timeout: float | None):
    """(live episode, opening token ids or None when it could not start)."""
    live = _Live(None, example)
    try:
        with deadline(timeout):
            env = factory()
            live.env = env
            if hasattr(env, "seed"):
                env.seed(seed)
            opening = list(env.reset(example))
        messages, extra = with_tools(opening, getattr(env, "tools", None), native)
        ids = encode_prompt(tokenizer, opening_text(tokenizer, messages, extra))
    except EnvTimeout:
        live.fail("env_timeouts")
        return live, None
    except Exception:  # noqa: BLE001 - an environment's failure ends its own episode only
        live.fail("reset_errors")
        return live, None
    if not ids or len(ids) > room:
        live.fail("openings_too_long")
        return live, None
    live.history, live.extra, live.active = messages, extra, True
    ep = live.ep
    ep.tokens, ep.model_mask, ep.logprobs = list(ids), [0] * len(ids), [0.0] * len(ids)
    ep.versions = [-1] * len(ids)
    ep.prompt_len, ep.messages = len(ids), list(opening)
    return live, ids


def _after_model_turn(live: _Live, sampled, logps, eos: set[int], tokenizer, turn: int,
                      max_turns: int, max_episode_tokens: int, max_tool_tokens: int,
                      max_env_tokens: int, timeout: float | None,
                      cut: bool = False) -> list[int] | None:
    """Record an episode's model turn, play the environment's answer; the environment's tokens
    to append when the episode goes on, else None (and the episode is finished). cut: the turn
    was stopped by the episode's token budget before its own end (it would have gone past
    max_episode_tokens)."""
    ep = live.ep
    turn_ids = [int(t) for t in sampled]
    end = next((k for k, t in enumerate(turn_ids) if t in eos), None)
    if end is not None:
        turn_ids = turn_ids[:end + 1]
    else:
        ep.count("turns_cut")  # max_new_tokens reached inside the turn
    room = max_episode_tokens - len(ep.tokens)
    over = cut or len(turn_ids) > room
    turn_ids = turn_ids[:room]
    ep.tokens += turn_ids
    ep.model_mask += [1] * len(turn_ids)
    ep.logprobs += [float(x) for x in logps[:len(turn_ids)]]
    ep.versions += [live.version] * len(turn_ids)
    ep.turns += 1
    ep.turn_ends.append(len(ep.tokens) - 1)
    ended_by_model = end is not None and not over
    body = turn_ids[:-1] if ended_by_model else turn_ids
    reply = tokenizer.decode(body)
    ep.messages.append({"role": "assistant", "content": reply})
    if over:
        ep.rewards.append(0.0)
        ep.limit, live.active = "max_episode_tokens", False
        return None
    try:
        with deadline(timeout):
            step = live.env.step(reply)
        new = _messages(step)
        reward = float(getattr(step, "reward", 0.0) or 0.0)
        for name, n in (getattr(step, "info", None) or {}).items():
            ep.count(name, n)
    except EnvTimeout:
        ep.rewards.append(0.0)
        live.fail("env_timeouts")
        return None
    except Exception:  # noqa: BLE001
        ep.rewards.append(0.0)
        live.fail("env_errors")
        return None
    ep.rewards.append(reward)
    ep.reward = float(sum(ep.rewards))
    if getattr(step, "done", False):
        ep.done, live.active = True, False
        ep.messages += new
        return None
    if turn + 1 >= max_turns:
        ep.limit, live.active = "max_turns", False
        ep.messages += new
        return None
    new = _cut_tools(tokenizer, new, max_tool_tokens, ep)
    ep.messages += new
    end_text = tokenizer.decode([turn_ids[-1]]) if ended_by_model else None
    try:
        text = after_turn_text(tokenizer, live.history, reply, end_text, new, live.extra)
    except Exception:  # noqa: BLE001 - messages this template cannot render end this episode
        live.fail("render_errors")
        return None
    ids = tokenizer.encode(text, add_special_tokens=False)
    if len(ids) > max_env_tokens:
        ep.limit, live.active = "max_env_tokens", False
        return None
    if len(ep.tokens) + len(ids) >= max_episode_tokens:
        ep.limit, live.active = "max_episode_tokens", False
        return None
    live.history = live.history + [{"role": "assistant", "content": reply}] + new
    ep.tokens += ids
    ep.model_mask += [0] * len(ids)
    ep.logprobs += [0.0] * len(ids)
    ep.versions += [-1] * len(ids)
    return ids
