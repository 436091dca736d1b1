"""The server's engine: one thread runs the paged engine (hone/sampling/scheduler.py) over the
requests the HTTP handlers submit, continuously batched across them.

`EngineLoop.submit(request, settings)` queues a completion request and returns its `Pending`,
whose events (new tokens, finished samples, an error) the handler reads as they come, which is
how a streamed response goes out while the engine decodes. Requests whose sampling settings
(temperature, top-k, top-p) equal those of the engine's current run join it at once; the decode
program takes one setting for its whole batch, so a request with other settings waits until the
current run has drained and then starts the next run. A harness that sends one setting is
served by one run that never ends.

Determinism: each request carries its own key (from its `seed`, else from the server's seed and
the request's arrival number), so its tokens do not depend on which other requests share its
decode batches (fp32; hone/sampling/scheduler.py, "Determinism").
"""

from __future__ import annotations

import itertools
import queue
import sys
import threading
from dataclasses import dataclass

from hone.sampling.requests import Request, Sample
from hone.sampling.scheduler import PagedEngine


@dataclass(frozen=True)
class Settings:
    """What one engine run samples with (the decode program's own switches)."""

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None


class Pending:
    """A submitted request's results as they come: `events` yields ("tokens", sample, ids,
    logprobs), ("done", sample, Sample) once per sample, or ("error", exception)."""

    def __init__(self, n: int):
        self.n, self.done = n, 0
        self.events: queue.Queue = queue.Queue()

    def samples(self, timeout: float | None = None) -> list[Sample]:
        """Wait for every sample (streamed tokens skipped); raises the engine's error."""
        out: list[Sample | None] = [None] * self.n
        while any(s is None for s in out):
            kind, *rest = self.events.get(timeout=timeout)
            if kind == "error":
                raise rest[0]
            if kind == "done":
                out[rest[0]] = rest[1]
        return out


class EngineLoop:
    """A background thread serving `submit`ted requests with one model's weights."""

    def __init__(self, model, *, eos_ids=(), max_seqs: int = 8, max_len: int = 2048,
                 page_size: int = 64, cache_dtype=None):
        self.eos_ids = tuple(eos_ids)
        # Short windows read at once, the first token read as soon as it is drawn: a stream
        # gets its first token after the prefill, then its tokens a window at a time.
        self.engine = PagedEngine(model, max_seqs=max_seqs, max_len=max_len, page_size=page_size,
                                  cache_dtype=cache_dtype, sync_steps=8, overlap=False,
                                  eager_first=True)
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: list[tuple] = []  # submitted with other settings than the current run's
        self.pending: dict[int, Pending] = {}
        self.ids = itertools.count()
        self.closed = threading.Event()
        self.thread = threading.Thread(target=self._main, daemon=True, name="hone-serve-engine")
        self.thread.start()

    @property
    def max_len(self) -> int:
        return self.engine.max_len

    def submit(self, request: Request, settings: Settings) -> Pending:
        pending = Pending(request.n)
        self.inbox.put((next(self.ids), request, settings, pending))
        return pending

    def close(self) -> None:
        self.closed.set()
        self.inbox.put(None)
        self.thread.join(timeout=30)

    # -- the engine thread ----------------------------------------------------------------------

    def _main(self) -> None:
        while not self.closed.is_set():
            first = self.waiting.pop(0) if self.waiting else self.inbox.get()
            if first is None:
                continue
            settings = first[2]
            feed = _Feed(self, settings, [first])
            try:
                self.engine.run([], temperature=settings.temperature, top_k=settings.top_k,
                                top_p=settings.top_p, eos_ids=self.eos_ids, feed=feed)
            except Exception as e:  # noqa: BLE001 - every request of the run hears of it
                print(f"hone serve: the engine stopped: {type(e).__name__}: {e}",
                      file=sys.stderr, flush=True)
                for index in list(self.pending):
                    self.pending.pop(index).events.put(("error", e))
                self.engine.pools = None  # rebuilt for the next run


class _Feed:
    """The engine run's view of the inbox (hone.sampling.requests.Feed)."""

    def __init__(self, loop: EngineLoop, settings: Settings, first: list[tuple]):
        self.loop, self.settings, self.first = loop, settings, first

    def poll(self, wait: bool):
        loop, items = self.loop, self.first
        self.first = []
        while True:
            try:
                item = loop.inbox.get(block=wait and not items, timeout=0.5)
            except queue.Empty:
                break
            if item is None:  # closing
                return None if not items else self._take(items)
            if item[2] != self.settings:
                loop.waiting.append(item)
                break
            items.append(item)
            wait = False
        if not items and (loop.waiting or loop.closed.is_set()):
            return None  # others wait for a run of their own settings
        return self._take(items)

    def _take(self, items):
        for index, _, _, pending in items:
            self.loop.pending[index] = pending
        return [(index, request) for index, request, _, _ in items]

    def tokens(self, index, sample, tokens, logprobs):
        self.loop.pending[index].events.put(("tokens", sample, list(tokens), list(logprobs)))

    def finished(self, index, sample, out):
        pending = self.loop.pending[index]
        pending.events.put(("done", sample, out))
        pending.done += 1
        if pending.done == pending.n:
            del self.loop.pending[index]

    def refused(self, index, error):
        self.loop.pending.pop(index).events.put(("error", error))
