"""What the rollout engine (hone/sampling/scheduler.py) is asked for and what it gives back.

A `Request` is a prompt to complete `n` times. A single-turn completion ends at an end token or
its budget. An episode is the same request with a turn callback (`PagedEngine.run(on_turn=)`):
when a sample's turn ends, the callback sees the turn's tokens and answers with tokens to
append (the environment's turn: they go into the sample's cache after the turn's last token and
the next model turn starts from them) or None (the sample is finished). A single turn is an
episode whose callback always answers None.

Everything that decides a sample's tokens travels with its request: the prompt, the key (sample
j draws its t-th token after the prompt with fold_in(fold_in(key, j), t), t counting appended
tokens too) and the policy version it is to be sampled with (asynchronous RL records it).

`SeqState` and `PrefillJob` are the engine's own bookkeeping of a sample on its way and of the
tokens queued for its pages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

import jax
import numpy as np


@dataclass
class Request:
    """A prompt to complete `n` times; sample j draws with fold_in(key, j).

    max_new_tokens: the tokens after the prompt, all turns and appended tokens together.
    turn_tokens: the tokens one model turn may sample (None: max_new_tokens).
    sample_limits: each sample's own max_new_tokens (<= max_new_tokens).
    first_sample: sample j draws with fold_in(key, first_sample + j) (a continuation of sample
    first_sample of an earlier request keeps its keys).
    resume: for each sample, what it has so far (a `Sample` of an earlier run: its tokens after
    the prompt, log-probs, model mask and turns): the sample goes on from there, its history
    prefilled (with whatever weights this run has) and its next model turn drawn at token index
    len(resume[j].tokens), so a sample continued this way draws the keys it would have drawn
    had it never stopped. An asynchronous run continues an episode under new weights so."""

    prompt: list[int]
    max_new_tokens: int
    key: jax.Array  # a typed PRNG key (jax.random.key)
    n: int = 1
    policy_version: int = 0  # the weights it is to be sampled with (asynchronous RL)
    sample_limits: tuple[int, ...] | None = None
    turn_tokens: int | None = None
    first_sample: int = 0
    resume: "tuple[Sample, ...] | None" = None

    def sample_out(self, j: int) -> "Sample":
        """Sample j's output to extend: empty, or a copy of what `resume` gives it."""
        if self.resume is None:
            return Sample(policy_version=self.policy_version)
        old = self.resume[j]
        return Sample(tokens=list(old.tokens), logprobs=list(old.logprobs),
                      sampling_logprobs=list(old.sampling_logprobs or [0.0] * len(old.tokens)),
                      model_mask=list(old.model_mask), turns=old.turns,
                      policy_version=self.policy_version)

    def resume_fits(self) -> bool:
        """Whether `resume` (if any) gives each sample a history within its budget."""
        if self.resume is None:
            return True
        limits = self.sample_limits or (self.max_new_tokens,) * self.n
        return len(self.resume) == self.n and all(
            len(x.tokens) < limits[j] and len(x.tokens) == len(x.logprobs) == len(x.model_mask)
            for j, x in enumerate(self.resume))


@dataclass
class Sample:
    """One completion: every token after the prompt (an end token included; in an episode the
    appended tokens too, `model_mask` 0 on them), the model's log-prob of each sampled token and
    the sampling distribution's (0 on appended tokens), why it stopped ("eos", "length": its
    budget; "done": the turn callback ended it), the model turns it took and how often it was
    preempted."""

    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    sampling_logprobs: list[float] = field(default_factory=list)
    model_mask: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    turns: int = 0
    preempted: int = 0
    policy_version: int = 0


@dataclass
class Turn:
    """A model turn that just ended, as the turn callback sees it: which sample (request index,
    sample index), the turn's tokens and log-probs, why it ended ("eos" or "length": the turn's
    or the sample's budget) and the room left for tokens after it (0: whatever the callback
    answers, the sample is finished)."""

    request: int
    sample: int
    tokens: list[int]
    logprobs: list[float]
    reason: str
    room: int


TurnCallback = Callable[[Turn], "list[int] | None"]


class Feed(Protocol):
    """Requests that keep arriving while the engine runs (a server): `PagedEngine.run(feed=)`.

    poll(wait) -> [(index, Request)], [] or None: the requests that arrived, each with an index
    the feed chose (unique while it runs); wait: nothing runs, so block until one arrives (a
    short wait is fine too); None: closed, the run ends once nothing runs.
    tokens(index, sample, tokens, logprobs): a sample's new sampled tokens, as they come.
    finished(index, sample, Sample): a sample is done.
    refused(index, error): a request the engine cannot hold (its InputError)."""

    def poll(self, wait: bool) -> "list[tuple[int, Request]] | None": ...

    def tokens(self, index: int, sample: int, tokens: list[int], logprobs: list[float]) -> None:
        ...

    def finished(self, index: int, sample: int, out: Sample) -> None: ...

    def refused(self, index: int, error: Exception) -> None: ...


@dataclass
class SeqState:
    """The engine's state of a sample on its way: where it is in its request, its pages and
    what it has."""

    request: int
    sample: int
    key: jax.Array
    limit: int
    out: Sample
    pages: list[int] = field(default_factory=list)
    running: bool = False
    order: int = 0  # admission order: the most recent is preempted first
    last: int = 0  # the sampled token not yet in the cache
    length: int = 0  # cache slots written (`last` goes to slot `length`)
    key_data: np.ndarray | None = None  # `key` as raw key data, for the decode batch
    turn_tokens: int = 0  # a model turn's budget
    turn_start: int = 0  # index in out.tokens of the running turn's first token
    turn_end: int = 0  # the index at which the running turn stops
    # Decode windows (hone/sampling/scheduler.py): its place on the device while it runs; the
    # tokens dispatched but not read yet (at most: a pending first token and each window's
    # writes); `epoch` counts its starts and stops, so a window read after it stopped is
    # ignored; `first` (its first token was drawn on the device and is read with its first
    # window), `fresh` (its next window starts it from the host's length and index) and
    # `host_last` (its pending token is `last`, not the place's).
    place: int | None = None
    ahead: int = 0
    epoch: int = 0
    first: bool = False
    fresh: bool = False
    host_last: bool = False


@dataclass
class PrefillJob:
    """The engine's queued work: tokens to put into pages before samples go on from them.
    kind "prompt": a request's prompt (its samples then draw their first token from the last
    logits); "resume": a preempted sequence's prompt and tokens but the last (which it then
    feeds as its pending token); "turn": an episode's last sampled token and the tokens
    appended after its turn, written after its cache (`offset` slots, in its own pages), its
    next turn's first token drawn from the last logits."""

    tokens: list[int]
    samples: list[SeqState]
    kind: str = "prompt"
    pages: list[int] = field(default_factory=list)
    offset: int = 0  # the slot of tokens[0]
    done: int = 0  # tokens already in pages
    logits: jax.Array | None = None  # [V] after the last chunk

    @property
    def end(self) -> int:
        return self.offset + len(self.tokens)
