"""Plain-text training logs read per rank by byte ranges aligned on line ends.

The files (one, a list or a glob) are seen as one byte stream cut into `world` equal ranges;
rank r reads only the lines that start in range r (traces.readers: seek, skip to the next
line end, stop after the line that crosses the end), so no rank parses the whole log and the
ranges together read every line exactly once.

Global batch s is then rank 0's s-th batch of its range, then rank 1's, ...: which rows form a
global batch depends on the world size (a converted dataset's does not). `--verify`'s reference
reads every range the same way, so it trains on the same global batches.

A pass over a range yields its whole batches of B rows (the tail is dropped) and starts over.
With `--epochs` every rank's pass is cut to the fewest whole batches any rank has (one
all-reduce, counting each rank's own rows once), so an epoch is the same steps on every rank.
gzip and UTF-16/32 text cannot be split by bytes (traces.readers.whole_read_reason): a list holding
one is read whole by every rank, which keeps its slice of each global batch, with a note suggesting
`picasso convert`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

from executor.data.batches import BadRows, RawBatch, RowCount, chunk_from_reader, rebatch, too_few_rows
from traces.dataset import expand_inputs

TEXT_FORMATS = ("criteo", "avazu", "csv", "tsv", "libsvm", "libfm")
Piece = tuple[str, int, int]  # (file, first byte, end byte)


def whole_read_note(data: str) -> str | None:
    """Why a text log is read whole by every rank, for the user (None: synthetic rows, no file)."""
    from traces.readers import whole_read_reason

    if data == "synthetic":
        return None
    why = next(filter(None, map(whole_read_reason, expand_inputs(data))), "not plain text")
    return (f"note: {data} is {why} and cannot be split by byte ranges: every rank reads all of it "
            "and keeps its rows; `picasso convert` it once so each rank reads only its own")


def splittable(data: str, fmt: str) -> bool:
    """Plain UTF-8 text in a line format: every file can be read by byte ranges."""
    if fmt.lower() not in TEXT_FORMATS or data == "synthetic":
        return False
    from traces.readers import whole_read_reason

    return all(whole_read_reason(p) is None for p in expand_inputs(data))


def byte_ranges(paths: list[str], world: int) -> list[list[Piece]]:
    """Per rank, the (file, lo, hi) pieces of its share of the files' concatenated bytes."""
    sizes = [os.path.getsize(p) for p in paths]
    total = sum(sizes)
    out: list[list[Piece]] = []
    for r in range(world):
        lo, hi = r * total // world, (r + 1) * total // world
        pieces, base = [], 0
        for p, n in zip(paths, sizes):
            a, b = max(lo, base), min(hi, base + n)
            if a < b:
                pieces.append((p, a - base, b - base))
            base += n
        out.append(pieces)
    return out


def range_chunks(pieces: list[Piece], fmt: str, strict: bool = False, bad: BadRows | None = None) -> Iterator[RawBatch]:
    """The rows of the lines starting in each piece, in order; malformed rows skipped and counted."""
    from traces.readers import open_reader

    for path, lo, hi in pieces:
        reader = open_reader(path, fmt, strict=strict, byte_range=(lo, hi))
        seen = 0
        for chunk in reader:
            if bad is not None:
                bad.add(reader.stats.rows_bad - seen, reader.stats.first_bad_reasons)
                seen = reader.stats.rows_bad
            yield chunk_from_reader(chunk)
        if bad is not None:
            bad.add(reader.stats.rows_bad - seen, reader.stats.first_bad_reasons)


def pass_batches(open_chunks: Callable[[], Iterator[RawBatch]], size: int, skip: int = 0,
                 per_pass: int | None = None, who: str = "this rank's share", bad: BadRows | None = None,
                 hint: str = "") -> Iterator[RawBatch]:
    """Batches of `size` rows over repeated passes of `open_chunks()`, from batch `skip` on.

    A pass yields its whole batches, at most `per_pass` (None: all of them, counted in the first
    pass); a skip past the first pass is taken modulo the pass, so a resume reads at most one
    pass more to get to its position."""
    while True:
        seen = 0
        count = RowCount()
        for b in rebatch(count.through(open_chunks()), size):
            if per_pass is not None and seen >= per_pass:
                break
            if seen >= skip:
                yield b
            seen += 1
        if seen == 0:
            raise too_few_rows(who, size, count.rows, bad, hint)
        if per_pass is None:
            per_pass = seen
        skip = skip % per_pass if skip >= seen else 0


def common_steps_per_epoch(pieces: list[Piece], fmt: str, size: int, comm) -> int:
    """The fewest whole batches of `size` rows any rank's range holds (collective)."""
    import torch

    mine = sum(len(c) for c in range_chunks(pieces, fmt)) // size
    if comm.world == 1:
        return mine
    import torch.distributed as dist

    t = torch.tensor([mine], dtype=torch.int64, device=comm.device)
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t.item())


class TextRanges:
    """The byte-range plan of a run: this rank's batches, and the whole global batches for --verify."""

    def __init__(self, data: str, fmt: str, world: int, rank: int, batch: int, strict: bool = False) -> None:
        self.data, self.fmt, self.world, self.rank, self.batch, self.strict = data, fmt, world, rank, batch, strict
        self.ranges = byte_ranges(expand_inputs(data), world)
        self.per_pass: int | None = None  # set by --epochs: every rank's pass cut to the same steps

    def open_mine(self, bad: BadRows | None) -> Callable[[], Iterator[RawBatch]]:
        passes = [0]

        def open_chunks():  # malformed rows counted once, in the first pass
            passes[0] += 1
            return range_chunks(self.ranges[self.rank], self.fmt, self.strict, bad if passes[0] == 1 else None)
        return open_chunks

    def local(self, skip: int, bad: BadRows | None, open_chunks=None) -> Iterator[RawBatch]:
        return pass_batches(open_chunks or self.open_mine(bad), self.batch, skip, self.per_pass,
                            f"rank {self.rank}'s byte range of {self.data}", bad, self._hint())

    def _hint(self) -> str:
        """What gives each rank more rows: fewer ranks share the log, or a converted dataset."""
        return "use fewer ranks or `picasso convert`" if self.world > 1 else ""

    def whole(self, skip: int) -> Iterator[RawBatch]:
        """Global batches as the ranks together train on them: rank 0's batch, rank 1's, ..."""
        streams = [pass_batches(lambda r=r: range_chunks(self.ranges[r], self.fmt), self.batch, skip, self.per_pass,
                                f"rank {r}'s byte range of {self.data}", hint=self._hint()) for r in range(self.world)]
        while True:
            yield RawBatch.concat([next(s) for s in streams])
