"""Streaming frequency counting of int64 IDs with bounded memory.

`IdCounter` counts exactly (sorted key/count arrays, chunk results buffered and merged
in batches) until a feature has more than `exact_cap` distinct IDs. Past the cap it keeps
(a) the heaviest IDs, pruned back to `exact_cap` whenever the table doubles (counts of IDs
that were pruned and came back are underestimated by at most `error_bound`, the sum
over prunes of the largest count dropped), and (b) a
KMV sample: the `sketch_k` distinct IDs with the smallest 64-bit hash, with their exact
counts (an ID enters the sample at its first occurrence, so its count is exact). The
sample estimates the distinct count and the tail's frequency-of-frequencies.
"""

from __future__ import annotations

import numpy as np

_GOLD = np.uint64(0x9E3779B97F4A7C15)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fixed, well-mixed 64-bit hash of int64 IDs (as uint64)."""
    z = np.asarray(x).astype(np.uint64) + _GOLD
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def unique_counts(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique values, counts): one sort, faster than np.unique's general path."""
    if len(x) == 0:
        return x[:0].astype(np.int64), np.zeros(0, np.int64)
    s = np.sort(x)
    starts = np.flatnonzero(np.concatenate(([True], s[1:] != s[:-1])))
    counts = np.diff(np.concatenate((starts, [len(s)])))
    return s[starts], counts.astype(np.int64)


def reduce_sorted(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sum counts of equal keys; keys must be sorted."""
    if len(keys) == 0:
        return keys, counts
    starts = np.flatnonzero(np.concatenate(([True], keys[1:] != keys[:-1])))
    return keys[starts], np.add.reduceat(counts, starts)


def merge_counts(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    """Merge (sorted unique keys, counts) pairs into one."""
    parts = [p for p in parts if len(p[0])]
    if not parts:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    if len(parts) == 1:
        return parts[0]
    k = np.concatenate([p[0] for p in parts])
    c = np.concatenate([p[1] for p in parts])
    if k.min() >= 0 and k.max() < (1 << 32) and c.max() < (1 << 31):
        # Key and count packed in one int64: a plain sort (much faster than argsort).
        packed = np.sort((k << 31) | c)
        return reduce_sorted(packed >> 31, packed & ((1 << 31) - 1))
    order = np.argsort(k, kind="stable")
    return reduce_sorted(k[order], c[order])


class IdCounter:
    def __init__(self, exact_cap: int = 2_000_000, sketch_k: int = 1 << 16) -> None:
        self.exact_cap = int(exact_cap)
        self.sketch_k = int(sketch_k)
        self.keys = np.zeros(0, np.int64)
        self.counts = np.zeros(0, np.int64)
        self._pending: list[tuple[np.ndarray, np.ndarray]] = []
        self._pending_size = 0
        self.exact = True
        self.error_bound = 0
        self.total = 0
        # KMV sample (only once past the cap): sorted by hash.
        self._kmv_hash = np.zeros(0, np.uint64)
        self._kmv_ids = np.zeros(0, np.int64)
        self._kmv_counts = np.zeros(0, np.int64)

    # -- adding ---------------------------------------------------------------------------
    def add(self, ids: np.ndarray) -> None:
        if len(ids) == 0:
            return
        self.add_counts(*unique_counts(ids))

    def add_counts(self, u: np.ndarray, c: np.ndarray) -> None:
        """Add counts `c` for sorted unique IDs `u`."""
        self.total += int(c.sum())
        if not self.exact:
            self._kmv_add(u, c)
        self._pending.append((u, c))
        self._pending_size += len(u)
        # Merge once the buffer is as large as the table: amortised O(log) work per key.
        if self._pending_size >= min(max(len(self.keys), 1 << 16), self.exact_cap):
            self.flush()

    def flush(self) -> None:
        if not self._pending:
            return
        parts, self._pending, self._pending_size = self._pending, [], 0
        self.keys, self.counts = merge_counts([(self.keys, self.counts), *parts])
        if len(self.keys) > (2 * self.exact_cap if not self.exact else self.exact_cap):
            if self.exact:
                self._start_sketch()
            self._prune()

    # -- past the cap ---------------------------------------------------------------------
    def _start_sketch(self) -> None:
        self.exact = False
        h = mix64(self.keys)
        take = np.argsort(h)[: self.sketch_k]
        order = take[np.argsort(h[take])]
        self._kmv_hash, self._kmv_ids, self._kmv_counts = h[order], self.keys[order], self.counts[order].copy()

    def _kmv_add(self, u: np.ndarray, c: np.ndarray) -> None:
        h = mix64(u)
        full = len(self._kmv_hash) >= self.sketch_k
        if full:
            sel = h <= self._kmv_hash[-1]
            h, u, c = h[sel], u[sel], c[sel]
            if len(h) == 0:
                return
        hh = np.concatenate([self._kmv_hash, h])
        ii = np.concatenate([self._kmv_ids, u])
        cc = np.concatenate([self._kmv_counts, c])
        order = np.argsort(hh, kind="stable")
        hh, ii, cc = hh[order], ii[order], cc[order]
        starts = np.flatnonzero(np.concatenate(([True], ii[1:] != ii[:-1])))
        # Equal IDs have equal hashes, so they are adjacent after the sort.
        hh, ii, cc = hh[starts], ii[starts], np.add.reduceat(cc, starts)
        k = self.sketch_k
        self._kmv_hash, self._kmv_ids, self._kmv_counts = hh[:k], ii[:k], cc[:k]

    def _prune(self) -> None:
        keep = np.argpartition(-self.counts, self.exact_cap - 1)[: self.exact_cap]
        dropped = np.ones(len(self.keys), bool)
        dropped[keep] = False
        if dropped.any():
            # An ID loses at most the largest dropped count at each prune it suffers.
            self.error_bound += int(self.counts[dropped].max())
        keep.sort()
        self.keys, self.counts = self.keys[keep], self.counts[keep]

    # -- results --------------------------------------------------------------------------
    def distinct(self) -> int:
        self.flush()
        if self.exact:
            return len(self.keys)
        k = len(self._kmv_hash)
        if k < self.sketch_k:
            return len(self._kmv_hash)
        frac = (float(self._kmv_hash[-1]) + 1.0) / 2.0**64
        return max(int(round((k - 1) / frac)), len(self.keys))

    def sorted_desc(self) -> tuple[np.ndarray, np.ndarray]:
        """(ids, counts) of the table, hottest first (ties broken by ID for stability)."""
        self.flush()
        order = np.lexsort((self.keys, -self.counts))
        return self.keys[order], self.counts[order]

    def lookup(self, ids: np.ndarray) -> np.ndarray:
        """Counts of `ids` in the table (0 where absent)."""
        self.flush()
        if len(self.keys) == 0:
            return np.zeros(len(ids), np.int64)
        pos = np.minimum(np.searchsorted(self.keys, ids), len(self.keys) - 1)
        return np.where(self.keys[pos] == ids, self.counts[pos], 0)

    def sample(self) -> tuple[np.ndarray, np.ndarray]:
        """(IDs, exact counts) of the KMV sample of distinct IDs (empty while exact)."""
        return self._kmv_ids.copy(), self._kmv_counts.copy()
