"""One agent episode's host side while it runs (`Live`): its start (the environment's reset and
opening, `start_episode`) and what follows each model turn (`after_model_turn`: the turn
recorded, the environment's step, its answer rendered and appended, or a new segment where the
chat template rewrote earlier turns). The rollout that drives them over the engine is
hone/agents/rollout.py; its docstring describes the episode, its limits and its failures.
"""

from __future__ import annotations

from jax.random import fold_in

from hone.agents.deadline import EnvTimeout, deadline
from hone.agents.episode import Episode
from hone.agents.render import NotAPrefix, after_turn_text, in_roles, opening_text, with_tools
from hone.sampling.generate import encode_prompt

CUT_MARK = "\n[cut: {n} more tokens]"
SEGMENT_FOLD = 1 << 20  # segment s of an episode draws from fold_in(its first key, this + s)


class Restart(list):
    """The token ids of a new segment's prompt (`after_model_turn`'s answer when the template
    rewrote earlier turns): the episode goes on from these alone."""


class Live:
    """Host-side state of one episode while it runs."""

    def __init__(self, env, example: dict):
        self.env, self.example = env, example
        self.ep = Episode()
        self.history: list[dict] = []  # the conversation as rendered (tools described)
        self.extra: dict = {}
        self.active = False
        self.version = 0  # the policy version sampling its turns now
        self.paused = False  # waits for the new weights (`Switch`) before its next turn
        self.key, self.sample = None, 0  # its first request's key and its sample index there
        self.segment_key = None  # the key of its running segment's request
        self.budget = 0  # its running segment's max_new_tokens
        self.cap = 0  # its tokens at most, every segment together
        self.start, self.prompt_end = 0, 0  # its running segment's prompt: tokens[start:end]

    def fail(self, event: str) -> None:
        self.ep.count(event)
        self.ep.reward = float(getattr(self.env, "fallback_reward", 0.0) or 0.0)
        self.active = False


def cut_tools(tokenizer, messages: list[dict], max_tool_tokens: int, ep: Episode) -> list[dict]:
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


def step_messages(step) -> list[dict]:
    msgs = list(getattr(step, "messages", None) or [])
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in msgs):
        raise TypeError("Step.messages must be a list of {'role': ..., 'content': ...} objects")
    return msgs


def start_episode(factory, example: dict, seed: int, tokenizer, native: bool, room: int,
                  timeout: float | None, template_args: dict | None = None):
    """(live episode, opening token ids or None when it could not start). template_args: the
    chat template's keyword arguments, for every rendering of the episode."""
    live = Live(None, example)
    try:
        with deadline(timeout):
            env = factory()
            live.env = env
            if hasattr(env, "seed"):
                env.seed(seed)
            opening = list(env.reset(example))
        messages, extra = with_tools(opening, getattr(env, "tools", None), native)
        extra = {**(template_args or {}), **extra}
        messages = in_roles(tokenizer, messages, extra)
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


def after_model_turn(live: Live, sampled, logps, eos: set[int], tokenizer, turn: int,
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
        new = step_messages(step)
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
    new = cut_tools(tokenizer, new, max_tool_tokens, ep)
    ep.messages += new
    end_text = tokenizer.decode([turn_ids[-1]]) if ended_by_model else None
    new = in_roles(tokenizer, new, live.extra, opening=False)
    history = live.history + [{"role": "assistant", "content": reply}] + new
    restart = False
    try:
        try:
            text = after_turn_text(tokenizer, live.history, reply, end_text, new, live.extra)
            ids = tokenizer.encode(text, add_special_tokens=False)
            env_ids = len(ids)
        except NotAPrefix:  # the template rewrote earlier turns: a new segment (module doc)
            ids = encode_prompt(tokenizer, opening_text(tokenizer, history, live.extra))
            env_ids = sum(len(tokenizer.encode(m["content"], add_special_tokens=False))
                          for m in new if isinstance(m.get("content"), str))
            restart = True
    except Exception:  # noqa: BLE001 - messages this template cannot render end this episode
        live.fail("render_errors")
        return None
    if env_ids > max_env_tokens:
        ep.limit, live.active = "max_env_tokens", False
        return None
    if len(ep.tokens) + len(ids) >= max_episode_tokens:
        ep.limit, live.active = "max_episode_tokens", False
        return None
    live.history = history
    if restart:
        ep.segments.append(len(ep.tokens))
        ep.count("template_rewrites")
        live.start, live.prompt_end = len(ep.tokens), len(ep.tokens) + len(ids)
        live.budget = max_episode_tokens - live.prompt_end
        live.segment_key = fold_in(live.key, SEGMENT_FOLD + len(ep.segments))
    ep.tokens += ids
    ep.model_mask += [0] * len(ids)
    ep.logprobs += [0.0] * len(ids)
    ep.versions += [-1] * len(ids)
    return Restart(ids) if restart else ids
