"""The rollout engine's programs, host side (hone/sampling/scheduler.py's `PagedEngine` builds on
`Programs`): the fixed set of shapes the engine runs (`programs`), compiling them all up front
(`warmup`), a run's sampling settings and weights, and the two small programs of a fork (a
first-token draw and a page copy), FORK_ROWS rows a call.

Every shape is known when the engine is built: a decode window for each row bucket
(`row_buckets(max_seqs)`), a prefill call for each block count (`block_buckets`), one
first-token draw and one page copy. So prompts of any length, new weights included, compile
nothing after `warmup` (tests/sampling/test_programs.py).
"""

from __future__ import annotations

import jax
import numpy as np

from hone.sampling.buckets import block_buckets, bucket, row_buckets
from hone.sampling.engine import pack_weights, split_for_sampling
from hone.sampling.pages import TRASH
from hone.sampling.paged import choose_first, copy_pages, init_places, init_pools, prefill_chunk
from hone.sampling.requests import SeqState
from hone.sampling.strategies import SamplingMode

__all__ = ["Programs", "FORK_ROWS"]

FORK_ROWS = 8  # samples a call of choose_first, page pairs a call of copy_pages


class Programs:
    """The programs part of the engine; `PagedEngine` owns the state these read and set:
    model, max_seqs, page_size, num_pages, cache_dtype, table_width, prefill_block,
    prefill_blocks, sync_steps, attention, fixed_window, pools, places, and the decode
    window's dispatch (`Windows._launch`)."""

    def _settings(self, temperature, top_k, top_p, eos_ids) -> None:
        """A run's sampling settings, and the weights and pools its programs take."""
        self.mode = SamplingMode(greedy=temperature == 0.0, top_k=top_k,
                                 use_top_p=top_p is not None)
        self.temperature = np.float32(temperature or 1.0)
        self.top_p = np.float32(top_p if top_p is not None else 1.0)
        eos = list(eos_ids)  # padded with -1 (no token) to a handful of sizes
        self.eos = jax.device_put(np.asarray(eos + [-1] * (bucket(len(eos), minimum=8)
                                                        - len(eos)), np.int32))
        self.eos_set = {int(e) for e in eos_ids}
        self.graphdef, self.params = split_for_sampling(self.model)
        self.packed = pack_weights(self.graphdef, self.params)
        if self.pools is None:
            self.pools = init_pools(self.model, self.num_pages, self.page_size, self.cache_dtype)
            self.places = init_places(self.max_seqs, self.pools)

    def programs(self) -> dict[str, list[int]]:
        """The shapes of every program a run of this engine can take: decode windows of
        `rows` sequences, prefill calls of `blocks` blocks (a page copy and a first-token draw
        of FORK_ROWS rows besides)."""
        return {"rows": row_buckets(self.max_seqs), "blocks": block_buckets(self.prefill_blocks)}

    def warmup(self, *, temperature: float = 1.0, top_k: int | None = None,
               top_p: float | None = None, eos_ids=()) -> None:
        """Compile every program a run with these sampling settings can take (`programs`), by
        running each once on nothing (padding rows, the trash page): later runs, new weights
        and prompts of any length included, compile nothing more. Returns when they ran."""
        self._settings(temperature, top_k, top_p, eos_ids)
        width, cap = self.prefill_block, self.prefill_blocks
        for rows in self.programs()["blocks"]:  # blocks of padding: nothing written or read
            logits = self._run_prefill(
                np.full((rows, self.table_width), TRASH, np.int32), np.zeros(rows, np.int32),
                np.zeros((rows, width), np.int32), np.zeros(rows, np.int32),
                np.zeros(cap, np.int32))
        spare = [self.max_seqs] * FORK_ROWS
        self.pools = copy_pages(self.pools, np.asarray([TRASH] * FORK_ROWS),
                                np.asarray([TRASH] * FORK_ROWS))
        key = np.asarray(jax.random.key_data(jax.random.key(0)))
        self.places = choose_first(logits, np.int32(0), np.asarray(np.stack([key] * FORK_ROWS)),
                                   np.zeros(FORK_ROWS, np.int32), self.places,
                                   np.asarray(spare, np.int32), self.mode, self.temperature,
                                   self.top_p)
        for rows in self.programs()["rows"]:
            out = self._launch(rows, [], key)
        jax.block_until_ready((self.pools, self.places, out))

    def _run_prefill(self, table, start, tokens, n_valid, last):
        """One prefill call (hone/sampling/paged.py `prefill_chunk`) into the pools; returns its
        logits, not waited for."""
        self.pools, logits = prefill_chunk(
            self.graphdef, self.params, self.pools, table, start, tokens, n_valid, last,
            page_size=self.page_size, fixed=self.fixed_window, pallas=self.attention)
        return logits

    def _copy_pages(self, src: list[int], dst: list[int]) -> None:
        """Page src[i] copied to page dst[i], FORK_ROWS pairs a call (one program; padded with
        copies of the trash page)."""
        for lo in range(0, len(src), FORK_ROWS):
            pad = [TRASH] * (FORK_ROWS - len(src[lo:lo + FORK_ROWS]))
            self.pools = copy_pages(self.pools, np.asarray(src[lo:lo + FORK_ROWS] + pad),
                                    np.asarray(dst[lo:lo + FORK_ROWS] + pad))

    def _choose_first(self, logits, seqs: list[SeqState]) -> None:
        """The first tokens of seqs, samples of one prompt whose logits are row `logits[1]` of
        the array `logits[0]` (a prefill call's), drawn into their places: FORK_ROWS samples a
        call (one program; padded rows draw into the spare place)."""
        array, row = logits
        for lo in range(0, len(seqs), FORK_ROWS):
            part = seqs[lo:lo + FORK_ROWS]
            pad = FORK_ROWS - len(part)
            self.places = choose_first(
                array, np.int32(row),
                np.asarray(np.stack([s.key_data for s in part] + [part[0].key_data] * pad)),
                np.asarray([len(s.out.tokens) for s in part] + [0] * pad, np.int32),
                self.places, np.asarray([s.place for s in part] + [self.max_seqs] * pad,
                                         np.int32), self.mode, self.temperature, self.top_p)
