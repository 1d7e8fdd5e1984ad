"""A converted dataset: sharded columnar `.npy` files under one folder, described by a manifest.

Layout of DIR (written by traces/convert.py):
- `manifest.json`: written last (format, rows, dense names and transform, features, shards,
  malformed rows skipped at conversion). No manifest, no dataset.
- `shard-NNNNN/`: `labels.npy` float32 [n], `dense.npy` float32 [n, F], `lens.npy` int32 [n, S]
  (IDs per row and feature), `rowptr.npy` int64 [n+1] (start of each row's IDs), `ids.npy`
  int64 [nnz] (raw IDs, row-major: row 0's IDs of every feature, then row 1's, ...).

IDs are stored raw: the table size is the model's, not the data's, so the mapping ID -> row
stays with the executor (executor/data/batches.py `to_batch`). Dense values are stored as read
or already passed through `dlrm_dense` (manifest `dense_transform`: "none" or "log1p").
Reads go through pread, not a memory map: the bytes a rank touched are copies it frees, so a
rank's resident memory does not grow with the dataset (any `.npy` tool can still mmap them).
"""

from __future__ import annotations

import glob
import os
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foundation import fields
from foundation.documents import read_json
from traces.errors import TraceError

FORMAT = "picasso-dataset-1"
MANIFEST = "manifest.json"
DENSE_TRANSFORMS = ("log1p", "none")
COLUMNS = ("labels", "dense", "lens", "rowptr", "ids")
# what `picasso convert` writes, little-endian whatever the machine: a header saying otherwise
# (big-endian values, int32 IDs, float64 dense) is another program's file
COLUMN_DTYPES = {"labels": "<f4", "dense": "<f4", "lens": "<i4", "rowptr": "<i8", "ids": "<i8"}
_HEADER = 128  # fixed .npy header size, so a column can be appended to before its length is known


def dlrm_dense(x: np.ndarray) -> np.ndarray:
    """DLRM's dense transform, the one rule for it: log(1 + max(x, 0)), missing (NaN) as 0."""
    x = np.nan_to_num(np.asarray(x, dtype=np.float32), nan=0.0)
    return np.log1p(np.maximum(x, 0)).astype(np.float32, copy=False)


def expand_inputs(specs: list[str] | str) -> list[str]:
    """Files named by paths or globs (`day_*.gz`), each glob sorted; a glob matching nothing is an error."""
    out: list[str] = []
    for s in [specs] if isinstance(specs, str) else specs:
        if any(c in s for c in "*?[") and not os.path.exists(s):
            hits = sorted(glob.glob(s))
            if not hits:
                raise TraceError(f"{s}: no file matches this pattern")
            out.extend(hits)
        else:
            out.append(s)
    return out


def is_dataset(path: str | os.PathLike) -> bool:
    return os.path.isdir(path) and os.path.exists(os.path.join(path, MANIFEST))


MAX_ROWS = fields.MAX_ROWS


def check_manifest(m: dict) -> list[tuple[str, int]]:
    """The manifest's fields checked for type and range (FieldError names the field); its shards as
    (name, rows), each name a folder inside the dataset's own."""
    for key in ("features", "dense"):
        for i, name in enumerate(fields.sequence(m.get(key), key)):
            fields.text(name, f"{key}[{i}]")
    if not m["features"]:
        raise fields.FieldError("field features: a dataset has at least one categorical feature")
    fields.text(m.get("dense_transform"), "dense_transform", DENSE_TRANSFORMS)
    fields.integer(m.get("rows"), "rows", 1, MAX_ROWS)
    fields.integer(m.get("malformed_rows", 0), "malformed_rows", 0)
    shards = []
    for i, s in enumerate(fields.sequence(m.get("shards"), "shards")):
        fields.mapping(s, f"shards[{i}]")
        shards.append((fields.file_name(s.get("name"), f"shards[{i}].name"),
                       fields.integer(s.get("rows"), f"shards[{i}].rows", 0, MAX_ROWS)))
    return shards


# ---------------------------------------------------------------------------------------
# .npy columns: appended to while streaming, read by row ranges
# ---------------------------------------------------------------------------------------
def _npy_header(dtype: np.dtype, shape: tuple[int, ...]) -> bytes:
    d = f"{{'descr': {np.lib.format.dtype_to_descr(dtype)!r}, 'fortran_order': False, 'shape': {shape!r}, }}"
    body = d.encode("latin1")
    pad = _HEADER - 10 - len(body) - 1
    if pad < 0:
        raise ValueError(f"shape {shape} does not fit a {_HEADER}-byte .npy header")
    return b"\x93NUMPY\x01\x00" + (_HEADER - 10).to_bytes(2, "little") + body + b" " * pad + b"\n"


def _dtype_name(dt: np.dtype) -> str:
    order = {"<": "little-endian ", ">": "big-endian "}.get(dt.byteorder if dt.byteorder != "=" else
                                                          ("<" if np.little_endian else ">"), "")
    return f"{order}{dt.name} ({dt.str})"


class NpyAppender:
    """A `.npy` file written chunk by chunk; the header (with the final shape) is written at close."""

    def __init__(self, path: Path, dtype, tail: tuple[int, ...] = ()) -> None:
        self.path, self.dtype, self.tail = path, np.dtype(dtype), tuple(tail)
        self.f = open(path, "wb")
        self.f.write(b"\0" * _HEADER)
        self.rows = 0

    def append(self, arr: np.ndarray) -> None:
        a = np.ascontiguousarray(arr, dtype=self.dtype)
        if a.shape[1:] != self.tail:
            raise ValueError(f"{self.path}: expected rows of shape {self.tail}, got {a.shape[1:]}")
        if a.size:
            self.f.write(memoryview(a.reshape(-1)).cast("B"))
        self.rows += len(a)

    def close(self) -> None:
        self.f.seek(0)
        self.f.write(_npy_header(self.dtype, (self.rows, *self.tail)))
        self.f.flush()
        os.fsync(self.f.fileno())
        self.f.close()


class NpyColumn:
    """Row ranges of one `.npy` file, read with pread (see the module note)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = os.open(path, os.O_RDONLY)
        with open(path, "rb") as f:
            try:
                version = np.lib.format.read_magic(f)
                read_header = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)
                shape, fortran, dtype = read_header(f)
            except ValueError as exc:
                raise TraceError(f"{path}: not a .npy column ({exc})") from None
            self.offset = f.tell()
        if fortran:
            raise TraceError(f"{path}: Fortran-ordered columns are not supported")
        self.shape, self.dtype = tuple(int(n) for n in shape), np.dtype(dtype)
        if self.dtype.hasobject or not self.shape:
            raise TraceError(f"{path}: not a column of numbers ({self.dtype} of shape {self.shape})")
        self.row_bytes = self.dtype.itemsize
        for n in self.shape[1:]:
            self.row_bytes *= n  # Python ints: a hostile header cannot wrap the size check around
        size = os.fstat(self.fd).st_size
        if size != self.offset + self.shape[0] * self.row_bytes:
            raise TraceError(f"{path}: {size} bytes, its header promises {self.offset + self.shape[0] * self.row_bytes}"
                             " (a truncated or damaged shard)")

    def read_into(self, lo: int, hi: int, out: np.ndarray) -> None:
        """Rows [lo, hi) straight into `out` (a C-contiguous array of that many rows): no extra copy."""
        want = (hi - lo) * self.row_bytes
        if want and os.preadv(self.fd, [memoryview(out.reshape(-1)).cast("B")], self.offset + lo * self.row_bytes) != want:
            raise TraceError(f"{self.path}: short read at rows {lo}..{hi}")

    def read(self, lo: int, hi: int) -> np.ndarray:
        n = hi - lo
        buf = os.pread(self.fd, n * self.row_bytes, self.offset + lo * self.row_bytes)
        if len(buf) != n * self.row_bytes:
            raise TraceError(f"{self.path}: short read at rows {lo}..{hi}")
        return np.frombuffer(buf, dtype=self.dtype).reshape((n, *self.shape[1:]))

    def close(self) -> None:
        os.close(self.fd)


# ---------------------------------------------------------------------------------------
# Reading a dataset
# ---------------------------------------------------------------------------------------
@dataclass
class Rows:
    """Rows read from a dataset: labels, dense and per-feature CSR (ids, offsets)."""

    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, F]
    sparse: dict[str, tuple[np.ndarray, np.ndarray]]


class Dataset:
    """A converted dataset, opened read-only; `read(segments)` returns the rows of global row ranges."""

    def __init__(self, path: str | os.PathLike, max_open_shards: int = 16) -> None:
        self.path = Path(path)
        mf = self.path / MANIFEST
        if not mf.exists():
            why = "no manifest.json: an interrupted conversion, or not a converted dataset"
            raise TraceError(f"{self.path}: {why}")
        try:
            m = read_json(mf, "dataset manifest")  # bounded in size and nesting
        except (OSError, ValueError) as exc:
            raise TraceError(f"{mf}: unreadable manifest ({exc})") from None
        if not isinstance(m, dict):
            raise TraceError(f"{mf}: not a dataset manifest (a JSON object expected)")
        if m.get("format") != FORMAT:
            raise TraceError(f"{mf}: format {m.get('format')!r}, expected {FORMAT!r}")
        try:
            shards = check_manifest(m)
        except fields.FieldError as exc:
            raise TraceError(f"{mf}: {exc}") from None
        self.manifest = m
        self.features: list[str] = list(m["features"])
        self.dense_names: list[str] = list(m["dense"])
        self.dense_transform: str = m["dense_transform"]
        self.shard_names = [name for name, _ in shards]
        sizes = np.array([rows for _, rows in shards], dtype=np.int64)
        self.starts = np.concatenate([[0], np.cumsum(sizes)])
        self.rows = int(self.starts[-1])
        if self.rows != m["rows"]:
            raise TraceError(f"{mf}: shards hold {self.rows} rows, the manifest says {m['rows']}")
        twice = next((n for i, n in enumerate(self.shard_names) if n in self.shard_names[:i]), None)
        if twice is not None:
            raise TraceError(f"{mf}: shard {twice!r} is listed more than once (its rows would be read twice)")
        for k in range(len(shards)):  # every column's header, before any row is read
            for c in self._columns(k).values():
                c.close()
        self._open: OrderedDict[int, dict[str, NpyColumn]] = OrderedDict()
        self.max_open = max_open_shards

    def _columns(self, k: int) -> dict[str, NpyColumn]:
        """Shard k's columns, opened and checked against the manifest: inside the dataset's folder,
        the format's dtype (byte order included), its rows and widths."""
        d = self.path / self.shard_names[k]
        top = os.path.realpath(self.path)
        n = int(self.starts[k + 1] - self.starts[k])
        cols: dict[str, NpyColumn] = {}
        try:
            for c in COLUMNS:
                f = d / f"{c}.npy"
                if not os.path.lexists(f):
                    raise TraceError(f"{f}: missing (a damaged dataset)")
                if os.path.commonpath([top, os.path.realpath(f)]) != top:
                    raise TraceError(f"{f}: leads out of the dataset folder (a link to {os.path.realpath(f)}); "
                                     "a dataset's shards are its own files")
                cols[c] = col = NpyColumn(f)
                want = np.dtype(COLUMN_DTYPES[c])
                if col.dtype != want:
                    raise TraceError(f"{f}: holds {_dtype_name(col.dtype)}, the dataset format stores "
                                     f"{_dtype_name(want)} (not written by picasso convert)")
            if cols["labels"].shape != (n,) or cols["rowptr"].shape != (n + 1,):
                raise TraceError(f"{d}: holds {cols['labels'].shape[0]} rows, the manifest says {n}")
            for c, width in (("dense", len(self.dense_names)), ("lens", len(self.features))):
                if cols[c].shape != (n, width):
                    raise TraceError(f"{d / (c + '.npy')}: shape {cols[c].shape}, the manifest gives {n} rows of {width}")
            if cols["ids"].shape[1:] != ():
                raise TraceError(f"{d / 'ids.npy'}: shape {cols['ids'].shape}, expected one ID per entry")
        except BaseException:
            for col in cols.values():
                col.close()
            raise
        return cols

    def _shard(self, k: int) -> dict[str, NpyColumn]:
        cols = self._open.get(k)
        if cols is not None:
            self._open.move_to_end(k)
            return cols
        cols = self._columns(k)
        self._open[k] = cols
        if len(self._open) > self.max_open:  # a bounded number of open files
            for c in self._open.popitem(last=False)[1].values():
                c.close()
        return cols

    def close(self) -> None:
        while self._open:
            for c in self._open.popitem()[1].values():
                c.close()

    def read_range(self, lo: int, hi: int) -> Rows:
        return self.read([(lo, hi)])

    def read(self, segments: list[tuple[int, int]]) -> Rows:
        """The rows of global ranges [lo, hi), in the given order: each column read with one pread per
        piece straight into one preallocated array (no per-piece arrays, no concatenation)."""
        pieces = []  # (shard, first row, end row, first ID, end ID)
        for lo, hi in segments:
            if not 0 <= lo <= hi <= self.rows:
                raise IndexError(f"rows {lo}..{hi} outside the dataset's {self.rows}")
            k = int(np.searchsorted(self.starts, lo, side="right")) - 1
            while lo < hi:
                a, end = lo - int(self.starts[k]), min(hi, int(self.starts[k + 1]))
                b = end - int(self.starts[k])
                cols = self._shard(k)
                p = cols["rowptr"].read(a, b + 1)
                pieces.append((k, a, b, int(p[0]), int(p[-1])))
                lo, k = end, k + 1
        n = sum(b - a for _, a, b, _, _ in pieces)
        nnz = sum(q - p for *_, p, q in pieces)
        labels = np.empty(n, np.float32)
        dense = np.empty((n, len(self.dense_names)), np.float32)
        lens = np.empty((n, len(self.features)), np.int32)
        ids = np.empty(nnz, np.int64)
        r = z = 0
        for k, a, b, p, q in pieces:
            cols = self._open[k] if k in self._open else self._shard(k)
            cols["labels"].read_into(a, b, labels[r : r + b - a])
            cols["dense"].read_into(a, b, dense[r : r + b - a])
            cols["lens"].read_into(a, b, lens[r : r + b - a])
            cols["ids"].read_into(p, q, ids[z : z + q - p])
            r, z = r + b - a, z + q - p
        return Rows(labels, dense, _feature_major(self.features, lens, ids))


def _feature_major(features: list[str], lens: np.ndarray, ids: np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Row-major IDs + lengths [n, S] -> per feature (ids, offsets [n+1]), by one scatter."""
    n, s = lens.shape
    if n and len(ids) <= n * s and lens.max(initial=0) <= 1:  # one ID or none per feature (Criteo): masks
        present = lens.astype(bool)
        full = np.zeros((n, s), np.int64)
        full[present] = ids  # row-major, as stored
        cs = np.zeros((s, n + 1), dtype=np.int64)
        np.cumsum(present.T, axis=1, out=cs[:, 1:])
        out = full.T[present.T]  # feature-major
        base = np.concatenate([[0], np.cumsum(cs[:, -1])])
        return {f: (out[base[i] : base[i + 1]], cs[i]) for i, f in enumerate(features)}
    cs = np.zeros((s, n + 1), dtype=np.int64)
    np.cumsum(lens.T, axis=1, out=cs[:, 1:])
    base = np.concatenate([[0], np.cumsum(cs[:, -1])])
    flat = lens.reshape(-1).astype(np.int64)
    if len(ids) == n * s and (flat == 1).all():  # every row has one ID per feature: a transpose
        out = ids.reshape(n, s).T.reshape(-1)
    else:
        dst = (cs[:, :-1] + base[:-1, None]).T.reshape(-1)  # feature-major start of (row, feature)
        src = np.zeros(len(flat), dtype=np.int64)
        np.cumsum(flat[:-1], out=src[1:])
        pos = np.repeat(dst - src, flat) + np.arange(len(ids), dtype=np.int64)
        out = np.empty(len(ids), dtype=np.int64)
        out[pos] = ids
    return {f: (out[base[i] : base[i + 1]], cs[i]) for i, f in enumerate(features)}


# ---------------------------------------------------------------------------------------
# The order of an epoch: a seeded permutation of runs of rows, computed, never stored
# ---------------------------------------------------------------------------------------
_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fast, well-spread hash of uint64 values."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def feistel_permute(j: np.ndarray, n: int, key: int, rounds: int = 4) -> np.ndarray:
    """A bijection of [0, n) (a Feistel network on 2^2h >= n values, cycle-walking back into range)."""
    if n <= 1:
        return np.asarray(j, dtype=np.int64).copy()
    h = max(1, (int(n - 1).bit_length() + 1) // 2)
    mask = np.uint64((1 << h) - 1)
    keys = _mix(np.arange(1, rounds + 1, dtype=np.uint64) + np.uint64(key & 0xFFFFFFFFFFFFFFFF))
    x = np.asarray(j, dtype=np.uint64).copy()
    todo = np.ones(len(x), dtype=bool)
    while todo.any():
        v = x[todo]
        left, right = v >> np.uint64(h), v & mask
        for k in keys:
            with np.errstate(over="ignore"):
                left, right = right, left ^ (_mix(right ^ k) & mask)
        v = (left << np.uint64(h)) | right
        x[todo] = v
        todo[todo] = v >= np.uint64(n)
    return x.astype(np.int64)


class EpochOrder:
    """Epoch e's order of a dataset's rows: runs of `run` consecutive rows in a seeded random order
    (the short last run stays last). A batch then reads a few contiguous ranges from all over the
    data, and the order needs no memory however many rows there are."""

    def __init__(self, rows: int, seed: int, run: int = 256) -> None:
        self.rows, self.seed, self.run = rows, seed, max(1, run)
        self.full_runs = rows // self.run

    def rows_at(self, epoch: int, lo: int, hi: int) -> np.ndarray:
        """Dataset rows at positions [lo, hi) of epoch `epoch`'s order."""
        p = np.arange(lo, hi, dtype=np.int64)
        inside = p < self.full_runs * self.run
        out = p.copy()
        q = p[inside]
        out[inside] = feistel_permute(q // self.run, self.full_runs, self._key(epoch)) * self.run + q % self.run
        return out

    def _key(self, epoch: int) -> int:
        return int(_mix(np.array([self.seed * 1_000_003 + epoch], dtype=np.uint64))[0])

    def segments(self, epoch: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """The same positions as contiguous row ranges, in order: one permuted index per run touched,
        not per row (a batch touches a few runs)."""
        if hi <= lo:
            return []
        run, full = self.run, self.full_runs * self.run
        first, last = lo // run, min(self.full_runs, -(-hi // run))
        perm = feistel_permute(np.arange(first, last, dtype=np.int64), self.full_runs, self._key(epoch)).tolist() \
            if last > first else []
        out: list[tuple[int, int]] = []
        p = lo
        for j, pj in zip(range(first, last), perm):
            if p >= hi:
                break
            end = min(hi, (j + 1) * run)
            a = pj * run + p - j * run
            b = a + end - p
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
            p = end
        if p < hi:  # the short last run stays in place
            a = max(p, full)
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], hi)
            else:
                out.append((a, hi))
        return out

    def segments_by_rows(self, epoch: int, lo: int, hi: int) -> list[tuple[int, int]]:
        """`segments` computed row by row from `rows_at` (the definition; tests compare the two)."""
        r = self.rows_at(epoch, lo, hi)
        if not len(r):
            return []
        cut = np.flatnonzero(np.diff(r) != 1) + 1
        starts = np.concatenate([[0], cut])
        ends = np.concatenate([cut, [len(r)]])
        return [(int(r[a]), int(r[b - 1]) + 1) for a, b in zip(starts, ends)]
