"""Episodes an outside harness plays against `hone serve`, kept token-exact for a trainer.

A request that names an episode (`"hone": {"episode": ID}` in the body; the openai client sends
it with `extra_body`) belongs to that episode's session. The first request's messages are its
opening, rendered with the chat template. A later request must repeat the conversation so far
(the messages it sent before, and each reply as the server returned it: content and tool calls)
and add new messages; only those are rendered, as the in-process sampler renders an
environment's turn (hone.agents.render.after_turn_text), and appended after the reply's sampled
ids. So the episode is one token sequence: the opening, the model's ids exactly as sampled
(never decoded and encoded again), the environment's rendered turns, and its tokens equal the
template's rendering of the whole conversation with the model's own ids where its replies are.

Where the chat template rewrites earlier turns (Qwen3 drops the reasoning of replies before a
new user query), the new messages cannot be appended: the episode starts a new segment, the
whole conversation rendered again, and samples after that alone, as the in-process rollout does
(hone/agents/rollout.py; `Episode.segments`).

A harness that rewrites the conversation (drops or edits earlier messages) cannot be continued
exactly: the session starts over from that request's messages and counts a `restart`; the
earlier turns are not in the episode the trainer gets.

The trainer's settings win over the harness's: every request of a session samples with the
run's temperature, top-k and top-p, at most `max_new_tokens` per reply and `max_episode_tokens`
in all, and with the key fold_in(fold_in(key(seed), episode number), call number), so the
episode depends only on the weights and what the harness sends.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import jax

from hone.agents.render import NotAPrefix, after_turn_text, in_roles, opening_text
from hone.agents.episode import Episode
from hone.agents.tool_messages import for_template
from hone.sampling.generate import encode_prompt
from hone.serve.engine_loop import Settings


@dataclass
class Session:
    """One episode's record (aligned lists over its tokens)."""

    number: int
    tokens: list[int] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_len: int = 0
    seen: list[dict] = field(default_factory=list)  # the conversation as the client holds it
    history: list[dict] = field(default_factory=list)  # as rendered (tools in the system turn)
    extra: dict = field(default_factory=dict)  # the template's keywords (tools=)
    reply: str = ""  # the last reply's text, its end token's text (None: it sampled none)
    end_text: str | None = None
    calls: int = 0
    turns: int = 0
    restarts: int = 0
    limit: str | None = None
    turn_ends: list[int] = field(default_factory=list)
    messages: list[dict] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)  # per token; -1 where not sampled
    segments: list[int] = field(default_factory=list)  # where each later segment starts


def _same(a: dict, b: dict) -> bool:
    """Two messages alike in what the template renders of them (tool-call ids aside)."""
    def calls(m):
        return [(c["function"]["name"], c["function"]["arguments"])
                for c in m.get("tool_calls") or []]
    return (a.get("role") == b.get("role") and (a.get("content") or "") == (
        b.get("content") or "") and calls(a) == calls(b))


class Sessions:
    """The episodes of one rollout, by id (see the module doc)."""

    def __init__(self, tokenizer, *, seed: int, settings: Settings, max_new_tokens: int,
                 max_episode_tokens: int, max_opening_tokens: int | None = None,
                 numbers: dict[str, int] | None = None, template_args: dict | None = None):
        """max_opening_tokens: a longer opening is not sampled after (the episode stays
        empty, `limit = "openings_too_long"`), and the rest of an episode gets at most
        max_episode_tokens - max_opening_tokens (a trainer's row: opening slots, then the
        rest). template_args: the chat template's keyword arguments (agent.template_args), for
        every rendering of every episode."""
        self.tokenizer, self.settings = tokenizer, settings
        self.template_args = dict(template_args or {})
        self.max_new_tokens, self.max_episode_tokens = max_new_tokens, max_episode_tokens
        self.max_opening_tokens = max_opening_tokens
        self.key = jax.random.key(seed)
        self.numbers = dict(numbers or {})  # episode id -> its number (the key's first fold)
        self.sessions: dict[str, Session] = {}
        self.lock = threading.Lock()

    def get(self, episode: str) -> Session:
        with self.lock:
            if episode not in self.sessions:
                number = self.numbers.get(episode, len(self.numbers) + len(self.sessions))
                self.sessions[episode] = Session(number)
            return self.sessions[episode]

    def prompt(self, session: Session, messages: list[dict], tools) -> tuple[list[int], int,
                                                                              jax.Array]:
        """(the episode's tokens to sample after, the reply's token budget, its key), after
        appending the request's new messages; budget 0: the episode is out of tokens."""
        tok = self.tokenizer
        n = len(session.seen)
        if session.calls and len(messages) > n and all(
                _same(a, b) for a, b in zip(messages, session.seen)):
            new, _ = for_template(messages[n:], None, tok.chat_template)
            new = in_roles(tok, new, session.extra, opening=False)
            history = session.history + [{"role": "assistant", "content": session.reply}] + new
            try:
                text = after_turn_text(tok, session.history, session.reply, session.end_text,
                                       new, session.extra)
                ids = tok.encode(text, add_special_tokens=False)
            except NotAPrefix:  # the template rewrote earlier turns: a new segment
                ids = encode_prompt(tok, opening_text(tok, history, session.extra))
                session.segments.append(len(session.tokens))
            session.history = history
            session.tokens += ids
            session.model_mask += [0] * len(ids)
            session.logprobs += [0.0] * len(ids)
            session.versions += [-1] * len(ids)
        else:
            if session.calls:
                session.restarts += 1
            msgs, extra = for_template(messages, tools or None, tok.chat_template)
            extra = {**self.template_args, **extra}
            msgs = in_roles(tok, msgs, extra)
            ids = encode_prompt(tok, tok.apply_chat_template(msgs, add_generation_prompt=True,
                                                             **extra))
            session.tokens, session.model_mask = list(ids), [0] * len(ids)
            session.logprobs, session.prompt_len = [0.0] * len(ids), len(ids)
            session.versions = [-1] * len(ids)
            session.history, session.extra, session.turn_ends = msgs, extra, []
            session.segments = []
        session.seen = list(messages)
        session.messages = list(messages)
        budget = min(self.max_new_tokens, self.max_episode_tokens - len(session.tokens))
        p = self.max_opening_tokens
        if p is not None:
            budget = min(budget, session.prompt_len + self.max_episode_tokens - p
                         - len(session.tokens))
            if session.prompt_len > p:
                budget, session.limit = 0, "openings_too_long"
        if budget < 1 and session.limit is None:
            session.limit = "max_episode_tokens"
        key = jax.random.fold_in(jax.random.fold_in(self.key, session.number), session.calls)
        session.calls += 1
        return list(session.tokens[(session.segments or [0])[-1]:]), max(budget, 0), key

    def record(self, session: Session, sample, reply: str, ended: bool, message: dict,
               version: int = 0) -> None:
        """A reply was sampled (by policy `version`): its ids join the episode; `message` is
        what the client got."""
        session.tokens += list(sample.tokens)
        session.versions += [version] * len(sample.tokens)
        session.model_mask += [1] * len(sample.tokens)
        session.logprobs += [float(x) for x in sample.logprobs]
        session.turn_ends.append(len(session.tokens) - 1)
        session.turns += 1
        session.reply = reply
        session.end_text = self.tokenizer.decode(sample.tokens[-1:]) if ended else None
        if not ended:
            session.limit = "max_new_tokens"
        session.seen = session.seen + [message]
        session.messages = session.seen

    def episode(self, episode: str, reward: float | None) -> Episode:
        """The trainer's Episode of a session: its tokens as recorded, the harness's reward
        (None: it gave none, so 0 and `missing_rewards` counted) on the last turn."""
        s = self.sessions.get(episode) or Session(-1)
        ep = Episode()
        if s.limit == "openings_too_long" or not s.turns:
            ep.count("openings_too_long" if s.limit == "openings_too_long" else "no_turns")
        else:
            ep.tokens, ep.model_mask, ep.logprobs = list(s.tokens), list(s.model_mask), list(
                s.logprobs)
            ep.prompt_len, ep.turns, ep.turn_ends = s.prompt_len, len(s.turn_ends), list(s.turn_ends)
            ep.versions, ep.segments = list(s.versions), list(s.segments)
            if s.segments:
                ep.count("template_rewrites", len(s.segments))
            ep.limit = s.limit
        ep.messages = list(s.messages)
        if s.restarts:
            ep.count("restarts", s.restarts)
        if reward is None:
            ep.count("missing_rewards")
        ep.reward = float(reward or 0.0)
        ep.done = reward is not None
        ep.rewards = [0.0] * max(ep.turns - 1, 0) + ([ep.reward] if ep.turns else [])
        return ep
