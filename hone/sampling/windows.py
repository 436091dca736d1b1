"""The rollout engine's decode windows, host side (hone/sampling/scheduler.py's `PagedEngine`
builds on `Windows`): which running sequences go into the next window and with which pages,
dispatching it, reading a window's tokens into its sequences, and preempting with a window out.

A window is `sync_steps` decode steps in one program (hone/sampling/paged.py `decode_window`).
With `overlap`, window k+1 goes out before window k is read: the host's work runs while the
device decodes, and the engine learns of a stop one window late (the stopped row rides along
masked; its epoch tells a later read to leave it alone). The page budget of a sequence counts
the tokens dispatched but not read yet (`SeqState.ahead`), so a window never writes past the
pages reserved for it.
"""

from __future__ import annotations

import time

import jax
import numpy as np

from hone.errors import InputError
from hone.sampling.buckets import row_bucket
from hone.sampling.pages import TRASH, pages_for
from hone.sampling.paged import decode_window
from hone.sampling.requests import SeqState

__all__ = ["Windows", "Window", "default_window", "default_overlap"]


class Windows:
    """The decode part of the engine's loop; `PagedEngine` owns the state these read: running,
    places, pools, unread, stats, sync_steps, overlap, fixed_window, page_size, table_width,
    max_seqs, and `_allocate`, `_end_turn`."""

    def _writes(self, seq: SeqState) -> int:
        """Tokens seq's next window may write: the window, or what is left of its turn after the
        tokens already dispatched."""
        return max(0, min(self.sync_steps, seq.turn_end - len(seq.out.tokens) - seq.ahead))

    def _decode(self) -> None:
        """Dispatch one decode window of the running sequences, after each got the pages it
        writes; then read the window before it (overlap) or this one."""
        t0 = time.perf_counter()
        ps = self.page_size
        for seq in list(self.running):  # oldest first: the newest is preempted for them
            if not seq.running:  # preempted (or ended, read) while an older one got its pages
                continue
            need = pages_for(seq.length + seq.ahead + self._writes(seq), ps) - len(seq.pages)
            if need > 0:
                pages = self._allocate(need, keep=seq)
                if pages is None:
                    raise InputError("the page pool is too small for the sequences it must "
                                     "hold at once", key="num_pages")
                seq.pages += pages
        # A sequence with nothing to write ends in a window not read yet: it waits for that.
        live = [(seq, self._writes(seq)) for seq in self.running]
        live = [(seq, w) for seq, w in live if w > 0 or seq.first or seq.fresh]
        window = self._dispatch(live) if live else None
        if self.overlap and window is not None:
            window, self.unread = self.unread, window
        elif self.unread is not None:  # nothing new to dispatch: read what is out
            window, self.unread = self.unread, window
        if window is not None:
            self._read(window)
        self.stats["decode_s"] += time.perf_counter() - t0

    def _dispatch(self, live: list[tuple[SeqState, int]]) -> Window:
        rows = row_bucket(len(live), self.max_seqs)
        out = self._launch(rows, [seq for seq, _ in live])
        for leaf in jax.tree.leaves(out):  # on its way to the host while the device works
            leaf.copy_to_host_async()
        window = Window([(seq, seq.epoch, w, seq.first) for seq, w in live], out)
        for seq, w in live:
            seq.ahead += w
            seq.first = seq.fresh = seq.host_last = False
        self.stats["decode_calls"] += 1
        self.stats["decode_rows"] += rows
        return window

    def _launch(self, rows: int, seqs: list[SeqState], key_data=None) -> dict:
        """Dispatch one decode window of `rows` rows, `seqs` in the first ones and padding (a
        fresh row past its limit, in the spare place; drawn with key_data, default the first
        sequence's) in the rest; returns its outputs, not waited for."""
        table = np.full((rows, self.table_width), TRASH, np.int32)
        st = {"place": np.full(rows, self.max_seqs, np.int32), "fresh": np.ones(rows, bool),
              "host_last": np.zeros(rows, bool), "last": np.zeros(rows, np.int32),
              "length": np.zeros(rows, np.int32), "index": np.zeros(rows, np.int32),
              "limit": np.zeros(rows, np.int32)}
        keys = [seq.key_data for seq in seqs]
        for r, seq in enumerate(seqs):
            table[r, :len(seq.pages)] = seq.pages
            st["place"][r], st["fresh"][r], st["host_last"][r] = (seq.place, seq.fresh,
                                                                  seq.host_last)
            st["last"][r], st["length"][r] = seq.last, seq.length
            st["index"][r], st["limit"][r] = len(seq.out.tokens) + seq.ahead, seq.turn_end
        pad = keys[0] if keys else key_data
        st["key_data"] = np.stack(keys + [pad] * (rows - len(seqs)))
        self.pools, self.places, out = decode_window(
            self.graphdef, self.params, self.packed, self.pools, self.places, table, st,
            self.eos, self.temperature, self.top_p, mode=self.mode, page_size=self.page_size,
            steps=self.sync_steps, pallas=self.attention, fixed=self.fixed_window)
        return out

    def _read(self, window: Window) -> None:
        """Take a window's tokens (the one blocking read of the device a window costs) into its
        sequences; end the turns that ended in it."""
        out = jax.device_get(window.out)
        self.stats["host_waits"] += 1
        emitted = out["emitted"]
        steps = self.sync_steps if self.fixed_window else int(emitted.any(axis=0).sum())
        self.stats["decode_steps"] += steps
        self.stats["row_steps"] += steps * emitted.shape[0]
        self.stats["wasted_row_steps"] += steps * emitted.shape[0] - int(emitted.sum())
        for r, (seq, epoch, writes, first) in enumerate(window.rows):
            if seq.epoch != epoch:  # it stopped (or was preempted) after this window went out
                continue
            seq.ahead -= writes + first
            e = emitted[r]
            seq.length += int(e.sum())
            # The first token (drawn before the window) if it is this window's to read, then
            # what the window emitted.
            taken = [out[name][r][e].tolist() for name in ("tokens", "logprobs",
                                                             "sampling_logprobs")]
            if first:
                for got, name in zip(taken, ("first_token", "first_logprob",
                                             "first_sampling_logprob")):
                    got.insert(0, out[name][r].item())
            self._take(seq, *taken)

    def _take(self, seq: SeqState, tokens: list, lps: list, slps: list) -> None:
        """Sampled tokens read from the device into seq's sample (and its feed); its turn ends
        here if the last of them ends it."""
        if not tokens:
            return
        seq.out.tokens += tokens
        seq.out.logprobs += lps
        seq.out.sampling_logprobs += slps
        seq.out.model_mask += [1] * len(tokens)
        seq.last = tokens[-1]
        if self.feed is not None:
            self.feed.tokens(seq.request, seq.sample, tokens, lps)
        if seq.last in self.eos_set or len(seq.out.tokens) >= seq.turn_end:
            self._end_turn(seq, "eos" if seq.last in self.eos_set else "length")

    def _preempt(self, seq: SeqState) -> None:
        """Read the window that is out first (its tokens are the sequence's to keep, and it may
        end the sequence), then preempt seq if it still runs. A sequence whose first token is
        still on the device (started this turn of the loop) reads it alone."""
        if self.unread is not None:
            window, self.unread = self.unread, None
            self._read(window)
        if seq.running and seq.first:
            self._read_first([seq])
        if seq.running:
            super()._preempt(seq)


    def _read_first(self, seqs: list[SeqState]) -> None:
        """Read the first tokens of `seqs` (drawn into their places, not read yet) now, in one
        blocking read: for a sequence about to be preempted, and for a server's stream
        (`eager_first`); their turns end here if the token ends them."""
        got = jax.device_get({k: self.places[k] for k in (  # whole: no program to compile
            "first_token", "first_logprob", "first_sampling_logprob")})
        self.stats["host_waits"] += 1
        for seq in seqs:
            seq.first, seq.ahead, seq.host_last = False, seq.ahead - 1, True
            k = seq.place
            self._take(seq, [int(got["first_token"][k])], [float(got["first_logprob"][k])],
                       [float(got["first_sampling_logprob"][k])])


class Window:
    """A dispatched decode window: its rows (sequence, its epoch then, the writes reserved,
    whether it reads the sequence's first token) and its outputs on their way to the host."""

    def __init__(self, rows: list, out: dict):
        self.rows, self.out = rows, out


def default_window() -> int:
    """Decode steps in one window (one program, one blocking read of the device): 32 on an
    accelerator, where each return to the host leaves the device idle; 16 on a CPU, where a
    read costs little and a shorter window masks fewer row-steps after stops: on the 2-core
    CPU 16-step windows with overlap measured 1.12x the tokens/s of 32-step ones on the
    long-tail rollout (304.9 against 271.1; 13% of row-steps masked against 20%), and 32-step
    ones 1.13x 8-step windows read at once on the uniform rollout (benchmarks/RESULTS.md "A
    fixed set of engine programs", "Decode windows on the device"). `hone serve` takes 8,
    read at once: a client's stream gets its tokens a window at a time."""
    return 16 if jax.default_backend() == "cpu" else 32


def default_overlap() -> bool:
    """Whether window k+1 goes out before window k is read: on every backend (on an
    accelerator the host's work runs while the device decodes; on the CPU, measured faster too:
    `default_window`)."""
    return True
