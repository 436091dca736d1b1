"""The rollout engine's host side: requests in, up to `max_seqs` sequences kept decoding.

`PagedEngine.run(requests)` completes every request's prompt `n` times. At most `max_seqs`
sequences decode at once; when one ends (end-of-sequence token or its token budget), its pages
are freed and a waiting sample takes its place at the next turn of the loop. Each turn:
1. fork: prompts whose prefill is done give samples to the free places. The G samples of a
   prompt share its full pages; each but the last copies the partly filled last page (the last
   takes the prompt's pages over), then writes its own pages;
2. prefill: the next waiting prompts that the free places can take, `prefill_chunk` tokens in
   all at most a call (a longer prompt goes in chunks, one a call), cut into blocks of
   PREFILL_BLOCK tokens side by side (a call's block count a power of two). While fewer than
   half of `max_seqs` sequences run, prefill calls follow each other until the places are
   taken (an idle engine fills up first); otherwise one call a turn, so a long prompt
   interleaves with the decoding of the others instead of stalling them;
3. decode: one window of `sync_steps` steps of the running sequences in one program
   (hone/sampling/paged.py `decode_window`), after each got the pages the window writes. The
   batch is as large as the running sequences need (`row_bucket`: 16, 32, 48, 64, 96, ... rows
   up to `max_seqs`), so a long tail of few sequences decodes a small batch, not max_seqs rows.
   With `overlap`, window k+1 goes out (from the state window k leaves in
   the engine's places on the device) before window k is read: the host's work of a turn runs
   while the device decodes, and a stop is seen one window late (the stopped row rides along
   masked; a read after a sequence stopped is ignored by its epoch). Starting a sequence reads
   nothing (its first token is drawn into its place); a window is the one blocking read.
Programs: the engine's shapes are a fixed set (`programs()`: the row counts of a decode window
and the block counts of a prefill call, a first-token draw and a page copy of FORK_ROWS rows),
so prompts of any length compile nothing new; `warmup()` compiles the whole set up front.
Episodes (`run(on_turn=)`): when a sample's model turn ends (an end token, the turn's budget
`Request.turn_tokens`), the callback answers with the tokens to append or None. Appended tokens
go to the head of the queue as a prefill into the sample's own pages, after its cache (its
turn's last token first), and its next turn starts from their logits: an episode keeps its
pages and never encodes its history again; between turns it holds its pages but no place.
When the pool runs out of pages (hone/sampling/admission.py: intake and room), the most
recently admitted sequence is preempted: its pages are freed and it waits at the head of the
queue to be recomputed from its prompt and the tokens it has (their keys and values prefilled
again), then continues where it stopped. This is counted (`stats["preempted"]`), never an
error; a pool too small for one sequence is.

Determinism: token t of sample j of a request (t counting every token after the prompt,
appended ones too) is drawn with fold_in(fold_in(request.key, j), t) from that sequence's own
logits, so the tokens depend on the request alone, not on `max_seqs`,
the order of admission, the other sequences in a decode batch or preemption (fp32; a preempted
sequence's recomputed keys are those of a prefill instead of decode steps, equal to rounding).
A request carries its key and its policy version, the two things an asynchronous RL run needs
to reproduce a rollout. A request may continue samples of an earlier run (`Request.resume`,
`first_sample`): their tokens so far are prefilled and they draw on with the keys they had.
"""

from __future__ import annotations

import collections
import time

import jax
import jax.numpy as jnp
import numpy as np

from hone.errors import InputError
from hone.kernels.pallas_paged import IMPLS as PALLAS_IMPLS
from hone.sampling.admission import Admission
from hone.sampling.buckets import block_bucket
from hone.sampling.pages import TRASH, PageAllocator, default_pool, pages_for
from hone.sampling.paged import (RAGGED_ROUTES, TPU_HEAD_DIM, XLA_ROUTES, paged_route,
                                 pool_bytes)
from hone.sampling.programs import Programs
from hone.sampling.requests import PrefillJob, Request, Sample, SeqState, Turn, TurnCallback
from hone.sampling.windows import Windows, Window, default_overlap, default_window

__all__ = ["PagedEngine", "Request", "Sample", "Turn"]

PREFILL_BLOCK = 32  # tokens a prefill block holds (fewer when prefill_chunk is smaller)


class PagedEngine(Programs, Windows, Admission):
    """Paged KV cache + continuous batching for one model's weights (see the module doc)."""

    def __init__(self, model, *, max_seqs: int = 8, page_size: int = 64,
                 num_pages: int | None = None, max_len: int | None = None, cache_dtype=None,
                 prefill_chunk: int = 1024, sync_steps: int | None = None,
                 attention: str | None = None, overlap: bool | None = None,
                 eager_first: bool = False):
        """attention: how a decode step reads the pages (hone/kernels/pallas_paged.py routes;
        None: the Pallas kernel on a GPU, else hone's CPU kernel or XLA's loop over pages;
        `paged_route` says which). "tpu" takes the Pallas TPU kernel, for head_dim a multiple
        of 128 only; "ragged" hone's ragged paged-attention kernel (TPU), prefill blocks and
        every layer's decode steps ("ragged-interpret": the same, interpreted). sync_steps: the
        decode window's steps (None: `default_window()`).
        overlap: dispatch each window before reading the one before it (None:
        `default_overlap()`). eager_first: read each sequence's first token as soon as it is
        drawn (a server's time to first token) instead of with its first window."""
        cfg = model.config
        sync_steps = default_window() if sync_steps is None else sync_steps
        self.overlap = default_overlap() if overlap is None else bool(overlap)
        self.eager_first = eager_first
        self.fixed_window = jax.default_backend() == "gpu"  # no data-dependent loop on a GPU
        for name, value in (("max_seqs", max_seqs), ("page_size", page_size),
                            ("prefill_chunk", prefill_chunk), ("sync_steps", sync_steps)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InputError(f"must be a positive integer, got {value!r}", key=name)
        self.model, self.max_seqs, self.page_size = model, max_seqs, page_size
        self.max_len = max_len or cfg.max_position_embeddings
        self.prefill_chunk, self.sync_steps = prefill_chunk, sync_steps
        self.prefill_block = min(PREFILL_BLOCK, prefill_chunk)  # a prefill call's block width
        self.prefill_blocks = max(1, prefill_chunk // self.prefill_block)  # blocks a call
        self.cache_dtype = jnp.dtype(cache_dtype or model.embedder.embedding[...].dtype)
        self.num_pages = num_pages or default_pool(max_seqs, self.max_len, page_size)
        self.table_width = pages_for(self.max_len, page_size)  # decode's page-table columns
        self.kv_bytes = pool_bytes(model, self.num_pages, page_size, self.cache_dtype)
        self.pools = self.places = None
        self.attention = paged_route() if attention is None else attention
        if self.attention not in (None, *PALLAS_IMPLS, *RAGGED_ROUTES, *XLA_ROUTES):
            raise InputError(f"unknown attention route {attention!r}; allowed: "
                             f"{', '.join((*PALLAS_IMPLS, *RAGGED_ROUTES, *XLA_ROUTES))} or None",
                             key="attention")
        if self.attention == "tpu" and cfg.head_dim % TPU_HEAD_DIM:
            raise InputError(f"the Pallas TPU kernel needs head_dim a multiple of {TPU_HEAD_DIM} "
                             f"(its blocks span the head dimension); this model's is "
                             f"{cfg.head_dim}: leave attention unset for XLA's loop",
                             key="attention")

    # ---- the loop ----------------------------------------------------------------------------
    def run(self, requests: list[Request], *, temperature: float = 1.0, top_k: int | None = None,
            top_p: float | None = None, eos_ids=(),
            on_turn: TurnCallback | None = None, feed=None) -> list[list[Sample]]:
        """Every request's n samples, request by request. on_turn: called when a sample's
        model turn ends (hone.sampling.requests); None: every sample is one turn.

        feed: requests that keep arriving (a server; hone.sampling.requests.Feed): polled every
        turn of the loop (waiting when nothing runs) until it says it is closed; it is told each
        sample's new tokens as they come and each finished sample, and `run` returns [] (the
        samples went to the feed)."""
        self._settings(temperature, top_k, top_p, eos_ids)
        self.prompts: dict[int, list[int]] = {}
        self.feed, self.unfinished = feed, collections.Counter()  # request -> samples to go
        self.on_turn = on_turn
        self.free_places = list(range(self.max_seqs - 1, -1, -1))
        self.unread: Window | None = None  # a dispatched decode window not read yet
        self.alloc = PageAllocator(self.num_pages)
        self.stats = collections.Counter()
        self.running: list[SeqState] = []  # in admission order
        self.admitted = 0
        results = [[None] * r.n for r in requests] if feed is None else []
        self.queue: collections.deque[PrefillJob] = collections.deque()
        for i, r in enumerate(requests):
            self._check(r, i)
        for i, r in enumerate(requests):
            self._admit(r, i)
        self.ready: collections.deque[PrefillJob] = collections.deque()
        while True:
            if feed is not None and not self._intake(feed):
                break  # closed, nothing left
            if not self._busy():
                if feed is None:
                    break
                continue  # waited for the feed in vain
            self.finished: list[SeqState] = []
            moved = self._fork()
            while self.queue and self._unclaimed() > 0:
                if not self._prefill():  # waits for pages the running sequences free
                    break
                moved = True
                self._fork()
                if 2 * len(self.running) >= self.max_seqs:  # busy: interleave with decoding
                    break
            if self.running:
                self._decode()
            elif not moved:
                raise InputError("the page pool is too small for the sequences it must hold "
                                 "at once", key="num_pages")
            for seq in self.finished:
                self.unfinished[seq.request] -= 1
                if not self.unfinished[seq.request]:
                    del self.unfinished[seq.request], self.prompts[seq.request]
                if feed is None:
                    results[seq.request][seq.sample] = seq.out
                else:
                    feed.finished(seq.request, seq.sample, seq.out)
        self.unread = None  # what is left there is of sequences that have stopped
        self.stats["peak_pages"] = self.alloc.peak
        return results

    # ---- 1. fork -----------------------------------------------------------------------------
    def _fork(self) -> bool:
        """Start the samples of prefilled groups in the free places; whether any started."""
        moved = False
        while self.ready and len(self.running) < self.max_seqs:
            group = self.ready[0]
            seqs = group.samples[:self.max_seqs - len(self.running)]
            last = len(seqs) == len(group.samples)  # the group's last samples: one inherits
            full, partial = divmod(group.end, self.page_size)
            copied = len(seqs) - last if partial else 0  # the inheritor keeps the original
            copies = self._allocate(copied, admit=True) if copied else []
            if copies is None:
                break
            moved = True
            if copies:
                self._copy_pages([group.pages[full]] * copied, copies)
            for k, seq in enumerate(seqs):
                if last and k == len(seqs) - 1:  # the group's own references pass to it
                    seq.pages = list(group.pages)
                else:
                    self.alloc.share(group.pages[:full])
                    seq.pages = group.pages[:full] + (copies[k:k + 1] if partial else [])
                if group.kind == "resume":  # it goes on with the token it had
                    self._start(seq, group.end, seq.out.tokens[-1])
                    continue
                seq.turn_start = len(seq.out.tokens)  # a turn starts: its first token is drawn
                seq.turn_end = min(seq.limit, seq.turn_start + seq.turn_tokens)  # below
                self._start(seq, group.end)
            if group.kind != "resume":
                for s in seqs:
                    if s.key_data is None:
                        s.key_data = np.asarray(jax.random.key_data(s.key))
                self._choose_first(group.logits, seqs)
                if self.eager_first:  # a stream sends the first token before any window
                    self._read_first(seqs)
            group.samples = group.samples[len(seqs):]
            if not group.samples:
                self.ready.popleft()
        return moved

    def _start(self, seq: SeqState, length: int, token: int | None = None) -> None:
        """seq runs from slot `length` on, its pending token `token` (None: a first token
        that `choose_first` draws into its place, read with its first window)."""
        seq.length, seq.epoch = length, seq.epoch + 1
        seq.first, seq.fresh, seq.host_last = token is None, True, token is not None
        seq.ahead = int(token is None)
        if token is not None:
            seq.last = token
            if token in self.eos_set or len(seq.out.tokens) >= seq.turn_end:
                self._end_turn(seq, "eos" if token in self.eos_set else "length")
                return
        seq.order = self.admitted
        if seq.key_data is None:  # a resumed sequence
            seq.key_data = np.asarray(jax.random.key_data(seq.key))
        self.admitted += 1
        seq.running = True
        seq.place = self.free_places.pop()
        self.running.append(seq)

    def _stop(self, seq: SeqState) -> None:
        if seq.running:
            seq.running = False
            seq.epoch += 1  # a window still to be read holds nothing more of this run
            self.free_places.append(seq.place)
            seq.place = None
            self.running.remove(seq)

    def _end_turn(self, seq: SeqState, reason: str) -> None:
        """A model turn ended: the sample is finished, or (an episode whose callback answers
        with tokens that fit) it waits at the head of the queue for them to be written after
        its cache, keeping its pages."""
        out = seq.out
        out.turns += 1
        self.stats["turns"] += 1
        room = seq.limit - len(out.tokens)
        more = None
        if self.on_turn is not None:
            more = self.on_turn(Turn(seq.request, seq.sample, out.tokens[seq.turn_start:],
                                     out.logprobs[seq.turn_start:], reason, room))
        if not more or len(more) >= room:  # nothing to append, or no room for a turn after it
            self._finish(seq, reason if not more else "length")
            return
        more = [int(t) for t in more]
        out.tokens += more
        out.logprobs += [0.0] * len(more)
        out.sampling_logprobs += [0.0] * len(more)
        out.model_mask += [0] * len(more)
        self._stop(seq)
        pages, seq.pages = seq.pages, []  # the queued prefill holds them until it forks
        self.queue.appendleft(PrefillJob([seq.last] + more, [seq], kind="turn", pages=pages,
                                       offset=seq.length))

    def _finish(self, seq: SeqState, reason: str) -> None:
        seq.out.finish_reason = reason
        self.alloc.release(seq.pages)
        seq.pages = []
        self._stop(seq)
        self.finished.append(seq)

    def _unclaimed(self) -> int:
        """Free places that no prefilled prompt's waiting samples will take."""
        return self.max_seqs - len(self.running) - sum(len(g.samples) for g in self.ready)

    # ---- 2. prefill --------------------------------------------------------------------------
    def _prefill(self) -> bool:
        """One chunk each of the waiting prompts that the free places can take (their samples
        counted), at most `prefill_chunk` tokens in all, cut into blocks of `prefill_block`
        tokens (a call's blocks a power of two: a handful of programs, whatever the prompts'
        lengths); False when the pool has no pages for the first of them yet."""
        free = self._unclaimed()
        picked, left = [], self.prefill_blocks
        for group in self.queue:
            if free <= 0 or left <= 0:
                break
            size = min(len(group.tokens) - group.done, left * self.prefill_block)
            picked.append((group, size))
            free -= len(group.samples)
            left -= -(-size // self.prefill_block)
        for k, (group, size) in enumerate(picked):
            need = pages_for(group.offset + group.done + size, self.page_size) - len(group.pages)
            before = self.stats["preempted"]
            pages = self._allocate(need, keep_groups=[g for g, _ in picked[:k + 1]],
                                   admit=True) if need > 0 else []
            if pages is None:  # the groups before it go first; it waits for pages
                picked = picked[:k]
                break
            group.pages += pages
            if self.stats["preempted"] != before:  # a group after it may have lost its pages
                picked = picked[:k + 1]
                break
        if not picked:
            return False
        width = self.prefill_block
        blocks = sum(-(-size // width) for _, size in picked)
        rows = block_bucket(blocks, self.prefill_blocks)
        table = np.full((rows, self.table_width), TRASH, np.int32)
        tokens = np.zeros((rows, width), np.int32)
        start, n_valid = np.zeros(rows, np.int32), np.zeros(rows, np.int32)
        last = np.zeros(self.prefill_blocks, np.int32)  # each group's last block
        r = 0
        for k, (group, size) in enumerate(picked):
            at = group.offset + group.done
            for lo in range(0, size, width):
                n = min(width, size - lo)
                table[r, :len(group.pages)] = group.pages
                tokens[r, :n] = group.tokens[group.done + lo:group.done + lo + n]
                start[r], n_valid[r] = at + lo, n
                r += 1
            last[k] = r - 1
        t0 = time.perf_counter()
        logits = self._run_prefill(table, start, tokens, n_valid, last)  # not waited for
        self.stats["prefill_calls"] += 1
        self.stats["prefill_tokens"] += sum(size for _, size in picked)
        self.stats["prefill_s"] += time.perf_counter() - t0
        for k, (group, size) in enumerate(picked):
            group.done += size
            if group.done == len(group.tokens):
                group.logits = (logits, k)
                self.queue.remove(group)
                self.ready.append(group)
        return True
