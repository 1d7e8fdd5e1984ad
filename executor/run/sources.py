"""Where a rank's training rows come from, behind one small interface (`DataSource`).

- `WholeStream`: every rank reads the whole log (synthetic rows, a preloaded log, a gzip or
  UTF-16 log that cannot be split) and keeps its slice of each global batch.
- `TextRangeSource`: a plain-text log, each rank reading its own byte range (executor.data.text_ranges).
- `DatasetSource`: a folder from `picasso convert`, each rank reading its own rows of each batch.

Each yields, per step, this rank's rows and, where --verify's reference needs it (rank 0), the
whole global batch the ranks train on together.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol

from executor.comm import Comm
from executor.data.batches import (
    BadRows,
    RawBatch,
    RowCount,
    dataset_batches,
    global_batches,
    reader_chunks,
    rebatch,
    steps_per_epoch,
    synthetic_raw,
    too_few_rows,
)
from executor.data.text_ranges import (
    TEXT_FORMATS,
    TextRanges,
    common_steps_per_epoch,
    range_chunks,
    splittable,
    whole_read_note,
)
from executor.run.config import RunConfig
from planner.plan import Plan
from traces.dataset import Dataset, is_dataset

Pair = tuple[RawBatch, "RawBatch | None"]


class DataSource(Protocol):
    reading: str  # how the ranks read it, as the run result says
    kind: str  # "dataset", or the text format
    note: str | None  # a line for the user (e.g. a log every rank reads whole)

    def epoch_steps(self) -> int:
        """Global batches in one pass over the data (may be a collective: every rank calls it)."""

    def steps_per_epoch(self) -> int | None:
        """One pass's steps when this source knows it without reading, for the result."""

    def batches(self, start_step: int) -> Iterator[Pair]:
        """From `start_step` on: this rank's rows and, where kept, the whole global batch."""

    def malformed(self, per_rank: list[tuple[int, str]]) -> tuple[int, str]:
        """Malformed rows skipped and the first of them, from each rank's own (count, first)."""


def resumed_batches(open_chunks: Callable[[], Iterator[RawBatch]], global_batch: int, skip: int,
                    bad: BadRows | None = None) -> Iterator[RawBatch]:
    """global_batches(skip=skip) that reads the data at most once more to get there.

    The data repeats in epochs: a skip past the end of the first pass is reduced modulo
    the epoch's batch count, so a huge data_position in a manifest cannot loop forever.
    """
    seen = 0
    count = RowCount()
    for b in rebatch(count.through(open_chunks()), global_batch):
        if seen >= skip:
            yield b
        seen += 1
    if seen == 0:
        raise too_few_rows("the data", global_batch, count.rows, bad)
    yield from global_batches(open_chunks, global_batch, skip=skip % seen if skip >= seen else 0)


class WholeStream:
    """Every rank reads the whole stream of global batches and keeps its slice of each."""

    reading = "whole stream per rank"

    def __init__(self, cfg: RunConfig, plan: Plan, rank: int, keep_whole: bool, bad: BadRows,
                 open_chunks: Callable[[], Iterator[RawBatch]], note: str | None = None) -> None:
        self.cfg, self.g, self.b, self.rank, self.keep_whole, self.bad = (
            cfg, plan.global_batch, plan.batch_size_per_rank, rank, keep_whole, bad)
        self.open_chunks, self.note = open_chunks, note
        self.kind = cfg.format

    def epoch_steps(self) -> int:
        return steps_per_epoch(self.cfg.data, self.cfg.format, self.g)

    def steps_per_epoch(self) -> int | None:
        return None

    def batches(self, start_step: int) -> Iterator[Pair]:
        lo = self.rank * self.b
        for gb in resumed_batches(self.open_chunks, self.g, start_step, self.bad):
            yield gb.slice(lo, lo + self.b), (gb if self.keep_whole else None)

    def malformed(self, per_rank: list[tuple[int, str]]) -> tuple[int, str]:
        return self.bad.count, self.bad.first  # every rank read the same rows


class TextRangeSource:
    """A plain-text log, each rank reading its own byte range (preloaded, or streamed per pass)."""

    reading = "byte ranges"

    def __init__(self, cfg: RunConfig, plan: Plan, comm: Comm, keep_whole: bool, bad: BadRows) -> None:
        self.cfg, self.comm, self.keep_whole, self.bad = cfg, comm, keep_whole, bad
        self.kind, self.note = cfg.format, None
        self.ranges = TextRanges(cfg.data, cfg.format, comm.world, comm.rank, plan.batch_size_per_rank, cfg.strict)
        self.preloaded: RawBatch | None = None
        if cfg.preload:
            mine = self.ranges.ranges[comm.rank]
            self.preloaded = RawBatch.concat(list(range_chunks(mine, cfg.format, cfg.strict, bad)))

    def epoch_steps(self) -> int:
        r = self.ranges
        r.per_pass = common_steps_per_epoch(r.ranges[self.comm.rank], self.cfg.format, r.batch, self.comm)
        return r.per_pass

    def steps_per_epoch(self) -> int | None:
        return self.ranges.per_pass

    def batches(self, start_step: int) -> Iterator[Pair]:
        raw = self.preloaded
        mine = self.ranges.local(start_step, self.bad, (lambda: iter([raw])) if raw is not None else None)
        whole = self.ranges.whole(start_step) if self.keep_whole else None
        for x in mine:
            yield x, (next(whole) if whole is not None else None)

    def malformed(self, per_rank: list[tuple[int, str]]) -> tuple[int, str]:
        return sum(n for n, _ in per_rank), next((first for _, first in per_rank if first), "")


class DatasetSource:
    """A converted dataset: each rank reads its own rows of each global batch, in the seeded order."""

    reading = "row ranges"
    kind = "dataset"
    note = None

    def __init__(self, cfg: RunConfig, plan: Plan, rank: int, keep_whole: bool) -> None:
        self.dataset = Dataset(cfg.data)
        self.g, self.b, self.rank, self.keep_whole = plan.global_batch, plan.batch_size_per_rank, rank, keep_whole
        self.seed = plan.seed if cfg.data_seed is None else cfg.data_seed

    def epoch_steps(self) -> int:
        return self.dataset.rows // self.g

    def steps_per_epoch(self) -> int | None:
        return self.dataset.rows // self.g

    def batches(self, start_step: int) -> Iterator[Pair]:
        ds, g, lo = self.dataset, self.g, self.rank * self.b
        mine = dataset_batches(ds, g, lo, lo + self.b, self.seed, start_step)
        whole = dataset_batches(ds, g, 0, g, self.seed, start_step) if self.keep_whole else None
        for x in mine:
            yield x, (next(whole) if whole is not None else None)

    def malformed(self, per_rank: list[tuple[int, str]]) -> tuple[int, str]:
        return int(self.dataset.manifest.get("malformed_rows", 0)), ""  # skipped at conversion


def open_source(cfg: RunConfig, plan: Plan, comm: Comm, bad: BadRows) -> DataSource:
    """The source `cfg.data` names, for this rank; rank 0 keeps whole global batches for --verify."""
    keep_whole = cfg.verify and comm.rank == 0
    if cfg.data == "synthetic":
        raw = synthetic_raw(plan.model, cfg.synthetic_rows or plan.global_batch * 8, seed=plan.seed + 1)
        return WholeStream(cfg, plan, comm.rank, keep_whole, bad, lambda: iter([raw]))
    if is_dataset(cfg.data):
        return DatasetSource(cfg, plan, comm.rank, keep_whole)
    if splittable(cfg.data, cfg.format):
        return TextRangeSource(cfg, plan, comm, keep_whole, bad)
    # gzip, UTF-16/32: every rank reads the whole log
    note = whole_read_note(cfg.data) if comm.world > 1 and cfg.format.lower() in TEXT_FORMATS else None
    if cfg.preload:
        raw = RawBatch.concat(list(reader_chunks(cfg.data, cfg.format, cfg.strict, bad)))
        return WholeStream(cfg, plan, comm.rank, keep_whole, bad, lambda: iter([raw]), note)
    passes = [0]

    def open_chunks() -> Iterator[RawBatch]:  # malformed rows counted once, in the first pass over the file
        passes[0] += 1
        return reader_chunks(cfg.data, cfg.format, cfg.strict, bad if passes[0] == 1 else None)
    return WholeStream(cfg, plan, comm.rank, keep_whole, bad, open_chunks, note)
