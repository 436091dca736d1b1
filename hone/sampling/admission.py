"""The rollout engine's intake and room (hone/sampling/scheduler.py's `PagedEngine` builds on
`Admission`): requests checked and queued, from the list `run` was given or from a feed that
keeps them coming (a server), and pages found for them, preempting when the pool runs out.

Preemption frees a running sequence's pages (the most recently admitted first), or those of an
episode waiting between turns; it waits at the head of the queue to be recomputed from its
prompt and the tokens it has. Admission never preempts while sequences run: it waits for their
pages, so admitting and preempting cannot chase each other.
"""

from __future__ import annotations

import collections

import jax

from hone.errors import InputError
from hone.sampling.pages import PageAllocator, pages_for
from hone.sampling.requests import PrefillJob, Request, SeqState

__all__ = ["Admission"]


class Admission:
    """Intake and page room of the engine; the engine's loop (`PagedEngine`) owns the state
    these read: queue, prompts, unfinished, running, alloc, stats, page_size, num_pages,
    max_len, and `_stop`."""

    queue: "collections.deque[PrefillJob]"
    alloc: PageAllocator

    def _busy(self) -> bool:
        return bool(self.queue or self.ready or self.running)

    def _admit(self, r: Request, i: int) -> None:
        """Queue request i's prompt (or, continuing samples, each one's history)."""
        self.prompts[i] = list(r.prompt)
        self.unfinished[i] = r.n
        limits = r.sample_limits or (r.max_new_tokens,) * r.n
        seqs = [SeqState(i, j, jax.random.fold_in(r.key, r.first_sample + j), limits[j],
                         r.sample_out(j), turn_tokens=r.turn_tokens or r.max_new_tokens)
                for j in range(r.n)]
        if r.resume is None:
            self.queue.append(PrefillJob(list(r.prompt), seqs))
        else:  # each continued sample prefills its own history
            self.queue.extend(PrefillJob(list(r.prompt) + s.out.tokens, [s]) for s in seqs)

    def _intake(self, feed) -> bool:
        """Take the feed's new requests (waiting for some when nothing runs); False once it
        is closed and nothing runs. A request the engine cannot hold is refused to the feed."""
        new = feed.poll(wait=not self._busy())
        if new is None:
            return self._busy()
        for index, r in new:
            try:
                self._check(r, index)
            except InputError as e:
                feed.refused(index, e)
                continue
            self._admit(r, index)
        return True

    def _check(self, r: Request, i: int) -> None:
        if not r.prompt:
            raise InputError("prompt is empty", key=f"requests[{i}].prompt")
        if r.max_new_tokens < 1 or r.n < 1 or (r.turn_tokens is not None
                                               and r.turn_tokens < 1):
            raise InputError("max_new_tokens, n and turn_tokens must be positive",
                             key=f"requests[{i}]")
        if r.sample_limits is not None and (len(r.sample_limits) != r.n or not all(
                1 <= x <= r.max_new_tokens for x in r.sample_limits)):
            raise InputError("sample_limits must give each of the n samples a budget between "
                             "1 and max_new_tokens", key=f"requests[{i}].sample_limits")
        need = len(r.prompt) + r.max_new_tokens
        if need > self.max_len:
            raise InputError(f"prompt of {len(r.prompt)} tokens plus max_new_tokens "
                             f"{r.max_new_tokens} exceeds {self.max_len}",
                             key=f"requests[{i}].prompt")
        if not r.resume_fits():
            raise InputError("resume must give each of the n samples its tokens, log-probs "
                             "and model mask so far, fewer tokens than its budget",
                             key=f"requests[{i}].resume")
        if pages_for(need, self.page_size) + 1 > self.num_pages - 1:
            raise InputError(f"a page pool of {self.num_pages} pages of {self.page_size} "
                             f"slots cannot hold one sequence of {need} tokens",
                             key="num_pages")

    def _allocate(self, n: int, keep: SeqState | None = None, keep_groups=(),
                  admit: bool = False) -> list[int] | None:
        """n pages, preempting until they fit: running sequences (newest first, never `keep`),
        then episodes waiting between turns (the last queued first, never one of
        `keep_groups`); None when nothing is left to preempt. `admit` (pages to start a
        sequence: a prefill, a fork) preempts nothing while sequences run (it waits for their
        pages instead, so admissions and preemptions cannot chase each other)."""
        while True:
            pages = self.alloc.allocate(n)
            if pages is not None:
                return pages
            if admit and self.running:
                return None
            running = [s for s in self.running if s is not keep]
            waiting = [g for g in self.queue if g.kind == "turn" and g.pages
                       and not any(g is k for k in keep_groups)]
            if running:
                self._preempt(max(running, key=lambda s: s.order))
            elif waiting:
                self._unpage(waiting[-1])
            else:
                return None

    def _unpage(self, group: PrefillJob) -> None:
        """Free the pages of an episode waiting between turns: its prefill becomes its prompt
        and every token it has (recomputed, counted as a preemption)."""
        seq = group.samples[0]
        self.stats["preempted"] += 1
        seq.out.preempted += 1
        self.alloc.release(group.pages)
        group.tokens = self.prompts[seq.request] + seq.out.tokens
        group.pages, group.offset, group.done = [], 0, 0

    def _preempt(self, seq: SeqState) -> None:
        """Stop seq and free its pages; it waits at the head of the queue to be recomputed."""
        self.stats["preempted"] += 1
        seq.out.preempted += 1
        self.alloc.release(seq.pages)
        seq.pages = []
        self._stop(seq)
        prompt = self.prompts[seq.request]
        self.queue.appendleft(PrefillJob(prompt + seq.out.tokens[:-1], [seq], kind="resume"))

