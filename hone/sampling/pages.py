"""The page pool's bookkeeping on the host: which pages are free, who holds each one.

The paged KV cache (hone/sampling/paged.py) stores every layer's keys and values in one pool of
fixed-size pages, [num_pages, K, page_size, H] per layer; a sequence's cache is the list of its
pages (its page table), in order: sequence slot s lives in page table[s // page_size] at offset
s % page_size. This file owns the allocation of those pages; it never touches an array.

Design choices:
- Page 0 is the trash page, never handed out: a write that must go nowhere (a padded prefill
  position, an idle slot's decode step) is sent there, so every program writes unconditionally
  and no branch depends on the data.
- Reference counts: the G samples of a prompt share its full pages (each holds one reference);
  a page is free again when its last holder lets it go. A partly filled last page is never
  shared: each sample copies it before writing (`PageAllocator.fork`'s caller does), so no
  sample ever writes into a page another sample reads.
- Running out is not an error: `allocate` returns None and the scheduler preempts a sequence.
"""

from __future__ import annotations

TRASH = 0  # the page that absorbs writes that go nowhere


def pages_for(tokens: int, page_size: int) -> int:
    """Pages that hold `tokens` cache slots."""
    return -(-tokens // page_size)


def default_pool(max_seqs: int, max_len: int, page_size: int) -> int:
    """The engine's default pool: the trash page, max_seqs sequences of max_len, and one page
    more, which a sample forked from a group that stays (its other samples wait) copies the
    group's last page into."""
    return 2 + max_seqs * pages_for(max_len, page_size)


class PageAllocator:
    """Free list and reference counts of pages 1..num_pages-1 (page 0 is the trash page)."""

    def __init__(self, num_pages: int):
        if num_pages < 2:
            raise ValueError(f"a page pool needs at least 2 pages (one is the trash page), "
                             f"got {num_pages}")
        self.num_pages = num_pages
        self.refs = [0] * num_pages
        self.free = list(range(num_pages - 1, 0, -1))  # popped from the end: 1, 2, 3, ...
        self.peak = 0  # the most pages held at once

    @property
    def used(self) -> int:
        return self.num_pages - 1 - len(self.free)

    def allocate(self, n: int) -> list[int] | None:
        """n fresh pages (one reference each), or None (and nothing taken) if fewer are free."""
        if n > len(self.free):
            return None
        pages = [self.free.pop() for _ in range(n)]
        for p in pages:
            self.refs[p] = 1
        self.peak = max(self.peak, self.used)
        return pages

    def share(self, pages: list[int]) -> None:
        """One more holder for each of `pages` (a sample forked from a prompt)."""
        for p in pages:
            assert self.refs[p] > 0, f"page {p} is not held"
            self.refs[p] += 1

    def release(self, pages: list[int]) -> None:
        """Drop one reference to each page; a page nobody holds is free again."""
        for p in pages:
            assert self.refs[p] > 0, f"page {p} released more often than held"
            self.refs[p] -= 1
            if self.refs[p] == 0:
                self.free.append(p)
