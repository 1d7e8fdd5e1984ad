"""Batches: global batches cut from a click log (or synthetic rows), sliced per rank.

Global batch s holds data rows [s*G, (s+1)*G) (G = batch_size_per_rank * world_size,
wrapping around at the end of the data); rank r trains on rows [r*B, (r+1)*B) of it and
the reference on all of it. Raw IDs map to rows as `id % num_rows` (here only: converted
datasets store raw IDs); dense features go through traces.dataset.dlrm_dense unless a converted
dataset stored them so; sequence bags keep their first max_len IDs.

A converted dataset (traces/dataset.py) is read by row ranges: global batch s of an epoch holds
positions [s*G, (s+1)*G) of that epoch's seeded order, and each rank reads only its slice.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np
import torch

from planner.model_spec import ModelSpec
from traces.dataset import Dataset, EpochOrder, dlrm_dense, expand_inputs, is_dataset


class DataError(ValueError):
    """The data does not fit the model (a missing feature, too few rows)."""


@dataclass
class RawBatch:
    """Rows of a click log as read: raw IDs per feature in CSR form."""

    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, F] raw
    sparse: dict[str, tuple[np.ndarray, np.ndarray]]  # feature -> (ids int64, offsets int64 [n+1])
    dense_ready: bool = False  # dense already transformed (a dataset converted with --dense log1p)

    def __len__(self) -> int:
        return len(self.labels)

    def slice(self, lo: int, hi: int) -> RawBatch:
        sp = {}
        for f, (ids, off) in self.sparse.items():
            sp[f] = (ids[off[lo] : off[hi]], off[lo : hi + 1] - off[lo])
        return RawBatch(self.labels[lo:hi], self.dense[lo:hi], sp, self.dense_ready)

    @staticmethod
    def concat(parts: list[RawBatch]) -> RawBatch:
        if len(parts) == 1:
            return parts[0]
        sp = {}
        for f in parts[0].sparse:
            ids = np.concatenate([p.sparse[f][0] for p in parts])
            offs, base = [np.zeros(1, np.int64)], 0
            for p in parts:
                offs.append(p.sparse[f][1][1:] + base)
                base += p.sparse[f][1][-1]
            sp[f] = (ids, np.concatenate(offs))
        if len({p.dense_ready for p in parts}) > 1:
            raise DataError("cannot join rows with transformed and raw dense features")
        return RawBatch(
            np.concatenate([p.labels for p in parts]), np.concatenate([p.dense for p in parts]), sp,
            parts[0].dense_ready,
        )


@dataclass
class Batch:
    """Model-ready tensors: table -> (table-local rows, offsets).

    A batch copied to a device keeps its offsets on the host too (`host_offsets`, numpy), so
    cutting it into micro-batches never reads a size back from the device."""

    labels: torch.Tensor
    dense: torch.Tensor
    sparse: dict[str, tuple[torch.Tensor, torch.Tensor]]
    host_offsets: dict[str, np.ndarray] | None = None
    # each table's rows may run past its last bag (fixed-size buffers of a captured CUDA graph,
    # executor.run.cuda_graph): the rows after offsets[-1] are padding and form one extra bag per
    # table, whose pooled row the model never reads
    pad_bags: bool = False
    packed: Packed | None = None  # the one buffer per dtype its tensors are views of (pin_memory)

    def __len__(self) -> int:
        return len(self.labels)

    def _host_offsets(self) -> dict[str, np.ndarray]:
        if self.host_offsets is not None:
            return self.host_offsets
        return {t: off.numpy() for t, (_, off) in self.sparse.items()}  # a host batch

    def slice(self, lo: int, hi: int) -> Batch:
        sp, ho = {}, {}
        host = self._host_offsets()
        for t, (rows, off) in self.sparse.items():
            h = host[t]
            a, b = int(h[lo]), int(h[hi])
            sp[t] = (rows[a:b], off[lo : hi + 1] - a)
            ho[t] = h[lo : hi + 1] - a
        return Batch(self.labels[lo:hi], self.dense[lo:hi], sp, ho if self.host_offsets is not None else None)

    def tensors(self) -> list[torch.Tensor]:
        """labels, dense, then each table's rows and offsets: the order `Packed` lays them out in."""
        return [self.labels, self.dense, *(x for pair in self.sparse.values() for x in pair)]

    def with_tensors(self, ts: list[torch.Tensor]) -> Batch:
        """This batch's structure over `ts` (in `tensors()` order)."""
        it = iter(ts[2:])
        sparse = {t: (next(it), next(it)) for t in self.sparse}
        return Batch(ts[0], ts[1], sparse, self._host_offsets(), self.pad_bags)

    def pin_memory(self) -> Batch:
        """A page-locked copy laid out in one buffer per dtype (`packed_copy`), so the copy to the
        GPU is one asynchronous copy per buffer (two: float labels and dense, int64 rows and
        offsets) instead of one per tensor."""
        return self.packed_copy(pin=True)

    def packed_copy(self, pin: bool = False) -> Batch:
        """A copy whose tensors are views of one buffer per dtype (`Packed`), page-locked with `pin`."""
        packed = Packed.of(self, pin)
        out = self.with_tensors(packed.views(packed.buffers))
        out.packed = packed
        return out

    def to(self, device: torch.device) -> Batch:
        if device.type == "cpu" or self.labels.device.type == device.type:  # one device per process
            return self
        if self.packed is not None:
            bufs = {k: b.to(device, non_blocking=True) for k, b in self.packed.buffers.items()}
            return self.with_tensors(self.packed.views(bufs))
        return Batch(
            self.labels.to(device, non_blocking=True), self.dense.to(device, non_blocking=True),
            {t: (r.to(device, non_blocking=True), o.to(device, non_blocking=True)) for t, (r, o) in self.sparse.items()},
            self._host_offsets(),
        )

    def record_stream(self, stream: torch.cuda.Stream) -> None:
        """Tell the caching allocator these tensors (copied on a side stream) are used on `stream`."""
        for t in self.tensors():
            t.record_stream(stream)


@dataclass
class Packed:
    """A batch's tensors as views of one contiguous buffer per dtype: `slots[i]` is tensor i's
    (dtype, offset, shape) in `Batch.tensors()` order."""

    buffers: dict[torch.dtype, torch.Tensor]
    slots: list[tuple[torch.dtype, int, tuple[int, ...]]]

    @classmethod
    def of(cls, batch: Batch, pin: bool) -> Packed:
        sizes: dict[torch.dtype, int] = {}
        slots = []
        for t in batch.tensors():
            slots.append((t.dtype, sizes.get(t.dtype, 0), tuple(t.shape)))
            sizes[t.dtype] = sizes.get(t.dtype, 0) + t.numel()
        buffers = {dt: torch.empty(n, dtype=dt, pin_memory=pin) for dt, n in sizes.items()}
        for t, (dt, off, _) in zip(batch.tensors(), slots):
            buffers[dt][off : off + t.numel()].view(t.shape).copy_(t)
        return cls(buffers, slots)

    def views(self, buffers: dict[torch.dtype, torch.Tensor]) -> list[torch.Tensor]:
        """The tensors as views of `buffers` (these, or their copies on a device)."""
        out = []
        for dt, off, shape in self.slots:
            n = int(np.prod(shape)) if shape else 1
            out.append(buffers[dt][off : off + n].view(shape))
        return out


def feature_map(model: ModelSpec, features: Iterable[str]) -> dict[str, str]:
    """The data feature each table reads (planner.features owns the rule); a table the data
    has no feature for is a DataError."""
    from planner.features import feature_map as table_features

    feats = set(features)
    out = table_features(model, feats)
    for t, f in out.items():
        if f is None:
            raise DataError(f"the data has no categorical feature for table {t!r} (features: {sorted(feats)[:8]}...)")
    return out


def check_dense_count(model: ModelSpec, data_dense: int, what: str = "the data") -> None:
    """The model reads every dense column of the data, no more and no fewer: training on a
    silent subset (say the first 2 of Criteo's 13) would be another model than the one asked for."""
    if data_dense != model.num_dense:
        raise DataError(f"model {model.name} takes {model.num_dense} dense features, {what} has {data_dense} "
                        f"(the model spec's num_dense must match the data's dense columns)")


def to_batch(raw: RawBatch, model: ModelSpec, fmap: dict[str, str]) -> Batch:
    """Raw rows -> tensors the model reads (ID -> row, dense transform, sequence clipping)."""
    check_dense_count(model, raw.dense.shape[1])
    dense = np.ascontiguousarray(raw.dense, dtype=np.float32) if raw.dense_ready else dlrm_dense(raw.dense)
    sparse = {}
    for t in model.tables:
        ids, off = raw.sparse[fmap[t.name]]
        rows = np.asarray(ids, dtype=np.int64) % t.num_rows  # every ID lands in its table
        off = np.asarray(off, dtype=np.int64)
        # the embedding kernels trust the bags: checked here, where the batch is built
        if len(off) != len(raw.labels) + 1 or off[0] != 0 or off[-1] != len(rows) or (np.diff(off) < 0).any():
            raise DataError(f"table {t.name}: bag offsets of feature {fmap[t.name]!r} are not a non-decreasing "
                            f"0..{len(rows)} over {len(raw.labels)} rows")
        if t.pooling == "none":
            lens = np.minimum(np.diff(off), t.max_len)
            keep = np.arange(len(rows)) - np.repeat(off[:-1], np.diff(off)) < np.repeat(lens, np.diff(off))
            rows = rows[keep]
            off = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        sparse[t.name] = (torch.from_numpy(rows), torch.from_numpy(off))
    return Batch(torch.from_numpy(np.ascontiguousarray(raw.labels, dtype=np.float32)), torch.from_numpy(dense), sparse)


def rebatch(chunks: Iterable[RawBatch], size: int, keep_tail: bool = False) -> Iterator[RawBatch]:
    """Cut a stream of chunks into batches of exactly `size` rows (the tail is dropped, or
    yielded last, shorter, with `keep_tail`)."""
    buf: list[RawBatch] = []
    have = 0
    for c in chunks:
        while len(c):
            take = min(size - have, len(c))
            buf.append(c.slice(0, take))
            have += take
            c = c.slice(take, len(c))
            if have == size:
                yield RawBatch.concat(buf)
                buf, have = [], 0
    if keep_tail and buf:
        yield RawBatch.concat(buf)


class RowCount:
    """Rows that went by in a pass, counted so a pass too short for one batch can say why."""

    def __init__(self) -> None:
        self.rows = 0

    def through(self, chunks: Iterable[RawBatch]) -> Iterator[RawBatch]:
        for c in chunks:
            self.rows += len(c)
            yield c


def too_few_rows(who: str, size: int, rows: int, bad: BadRows | None, hint: str = "") -> DataError:
    """The one line for data holding fewer rows than one batch, naming the real cause: malformed
    rows when the reader skipped some, else the count (and `hint`, what would give more rows)."""
    if bad is not None and bad.count:
        head = (f"{who}: every row is malformed ({bad.count:,} skipped)" if rows == 0 else
                f"{who} holds fewer well-formed rows ({rows:,}) than one batch ({size}); {bad.count:,} malformed "
                f"rows skipped")
        return DataError(head + (f"; the first: {bad.first}" if bad.first else ""))
    return DataError(f"{who} holds fewer rows ({rows:,}) than one batch ({size})" + (f": {hint}" if hint else ""))


def chunk_from_reader(chunk) -> RawBatch:
    """traces.readers Chunk -> RawBatch."""
    return RawBatch(np.asarray(chunk.labels, np.float32), np.asarray(chunk.dense, np.float32), dict(chunk.sparse))


@dataclass
class BadRows:
    """Malformed rows skipped while reading (as `picasso analyze` counts them)."""

    count: int = 0
    first: str = ""

    def add(self, n: int, first: list[str]) -> None:
        if n and not self.first and first:
            self.first = first[0]
        self.count += n


def reader_chunks(path: str, fmt: str, strict: bool = False, bad: BadRows | None = None) -> Iterator[RawBatch]:
    """Chunks of a text/Parquet log (a path or a glob of several); malformed rows are skipped and
    counted in `bad` (`strict`: the first one raises, naming its line)."""
    from traces.readers import open_reader

    for p in expand_inputs(path):
        reader = open_reader(p, fmt, strict=strict)
        seen = 0
        for chunk in reader:
            if bad is not None:  # counted as it goes: a run may stop before the file ends
                bad.add(reader.stats.rows_bad - seen, reader.stats.first_bad_reasons)
                seen = reader.stats.rows_bad
            yield chunk_from_reader(chunk)
        if bad is not None:
            bad.add(reader.stats.rows_bad - seen, reader.stats.first_bad_reasons)


def dataset_batches(ds: Dataset, global_batch: int, lo: int, hi: int, seed: int, start_step: int = 0,
                    stop_step: int | None = None) -> Iterator[RawBatch]:
    """Rows [lo, hi) of each global batch of a converted dataset, from step `start_step` (epochs follow
    each other, each in its own seeded order; the rows left over after the last whole batch of an
    epoch are skipped in that epoch). Reads only those rows: memory is one batch, not the dataset."""
    per_epoch = ds.rows // global_batch
    if per_epoch < 1:
        raise DataError(f"{ds.path}: {ds.rows} rows, fewer than one global batch ({global_batch})")
    order = EpochOrder(ds.rows, seed)
    s = start_step
    while stop_step is None or s < stop_step:
        e, k = divmod(s, per_epoch)
        r = ds.read(order.segments(e, k * global_batch + lo, k * global_batch + hi))
        yield RawBatch(r.labels, r.dense, r.sparse, ds.dense_transform == "log1p")
        s += 1


def steps_per_epoch(data: str, fmt: str, global_batch: int) -> int:
    """Whole global batches in one pass over the data (a text log is counted by reading it)."""
    if is_dataset(data):
        return Dataset(data).rows // global_batch
    return sum(len(c) for c in reader_chunks(data, fmt)) // global_batch


def global_batches(
    open_chunks, global_batch: int, skip: int = 0, epochs: int | None = None, bad: BadRows | None = None
) -> Iterator[RawBatch]:
    """Global batches from `open_chunks()` (called again for each pass over the data), skipping `skip`."""
    n_epoch = 0
    produced = 0
    while epochs is None or n_epoch < epochs:
        any_batch = False
        count = RowCount()
        for b in rebatch(count.through(open_chunks()), global_batch):
            any_batch = True
            if produced >= skip:
                yield b
            produced += 1
        if not any_batch:
            raise too_few_rows("the data", global_batch, count.rows, bad)
        n_epoch += 1


def synthetic_raw(model: ModelSpec, rows: int, seed: int = 0, alpha: float = 1.1) -> RawBatch:
    """Skewed synthetic rows for any model: Zipf IDs per table feature, multi-hot by pooling factor."""
    rng = np.random.default_rng(seed)
    dense = rng.lognormal(1.0, 1.5, size=(rows, model.num_dense)).astype(np.float32)
    sparse = {}
    for i, t in enumerate(model.tables):
        if t.pooling == "none":
            lens = rng.integers(0, t.max_len + 1, size=rows)
        elif t.pooling_factor == 1.0:
            lens = np.ones(rows, dtype=np.int64)
        else:
            lens = rng.poisson(t.pooling_factor, size=rows)
        ids = (rng.zipf(alpha, size=int(lens.sum())) - 1 + i * 7919).astype(np.int64)
        sparse[t.name] = (ids, np.concatenate([[0], np.cumsum(lens)]).astype(np.int64))
    logit = dense[:, :1].sum(1) * 0.1 - 0.5 if model.num_dense else np.zeros(rows)
    labels = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    return RawBatch(labels, dense, sparse)


class Prefetcher:
    """Runs an iterator in a background thread so loading overlaps training."""

    _END = object()

    def __init__(self, it: Iterable, depth: int = 4) -> None:
        self.q: queue.Queue = queue.Queue(maxsize=depth)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(iter(it),), daemon=True)
        self.thread.start()

    def _run(self, it: Iterator) -> None:
        try:
            for x in it:
                while not self.stop.is_set():
                    try:
                        self.q.put(x, timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if self.stop.is_set():
                    return
            self.q.put(self._END)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the consumer
            self.q.put(exc)

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self):
        x = self.q.get()
        if x is self._END:
            raise StopIteration
        if isinstance(x, BaseException):
            raise x
        return x

    def close(self) -> None:
        """Stop the thread and wait for it: a thread left inside torch at exit aborts the process."""
        self.stop.set()
        while self.thread.is_alive():
            try:
                self.q.get(timeout=0.05)  # unblock a pending put
            except queue.Empty:
                pass
            self.thread.join(timeout=0.05)


class DeviceFeeder:
    """Yields (batch on the device, kept) from an iterator of (host batch, kept).

    On a GPU the next batch's copy is issued on a side stream as soon as the current one is
    handed out, so it overlaps the current step; the step's stream waits for the copy with
    an event, never the host. On a CPU it passes batches through."""

    def __init__(self, it, device: torch.device) -> None:
        self.it = iter(it)
        self.dev = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self.ahead = self._issue()

    def _issue(self):
        try:
            local, keep = next(self.it)
        except StopIteration:
            return None
        if self.stream is None:
            return local, keep, None
        with torch.cuda.stream(self.stream):
            on_dev = local.to(self.dev)
            done = torch.cuda.Event()
            done.record(self.stream)
        return on_dev, keep, done

    def __iter__(self) -> DeviceFeeder:
        return self

    def __next__(self):
        if self.ahead is None:
            raise StopIteration
        local, keep, done = self.ahead
        if done is not None:
            cur = torch.cuda.current_stream(self.dev)
            cur.wait_event(done)
            local.record_stream(cur)
        self.ahead = self._issue()
        return local, keep
