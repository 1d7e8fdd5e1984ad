"""Convert click logs (any traces.readers format, one file or many) into a dataset (traces/dataset.py).

Streams reader chunks straight into the shard columns: memory holds one reader chunk (about
`chunk_bytes` of input) whatever the input's size. Everything is written into a hidden
temporary folder beside the output, fsynced, the manifest last, and the folder renamed into
place: an interrupted conversion leaves no folder under the output's name, and a folder
without a manifest is never read as a dataset. A conversion killed outright leaves its hidden
folder (`.NAME.converting-PID`) and its writer lock beside the output; the next conversion to
that output holds the writer lock, so no such writer is alive, and removes them (a dataset
moved aside by a --force replacement killed mid-swap, `.NAME.old-PID`, is put back first).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from foundation.documents import read_json
from foundation.files import check_creatable, folders_for, fsync_dir
from foundation.locks import one_writer_beside
from traces.dataset import (
    COLUMN_DTYPES,
    DENSE_TRANSFORMS,
    FORMAT,
    MANIFEST,
    NpyAppender,
    dlrm_dense,
    expand_inputs,
    is_dataset,
)
from traces.errors import TraceError
from traces.readers import Chunk, open_reader

Progress = Callable[[float, float], None]


class _ShardWriter:
    def __init__(self, folder: Path, num_dense: int, num_features: int) -> None:
        folder.mkdir()
        self.folder = folder
        self.cols = {
            "labels": NpyAppender(folder / "labels.npy", COLUMN_DTYPES["labels"]),
            "dense": NpyAppender(folder / "dense.npy", COLUMN_DTYPES["dense"], (num_dense,)),
            "lens": NpyAppender(folder / "lens.npy", COLUMN_DTYPES["lens"], (num_features,)),
            "rowptr": NpyAppender(folder / "rowptr.npy", COLUMN_DTYPES["rowptr"]),
            "ids": NpyAppender(folder / "ids.npy", COLUMN_DTYPES["ids"]),
        }
        self.cols["rowptr"].append(np.zeros(1, np.int64))
        self.nnz = 0

    @property
    def rows(self) -> int:
        return self.cols["labels"].rows

    def append(self, labels, dense, lens: np.ndarray, ids_row_major: np.ndarray) -> None:
        c = self.cols
        c["labels"].append(labels)
        c["dense"].append(dense)
        c["lens"].append(lens)
        c["rowptr"].append(self.nnz + np.cumsum(lens.sum(axis=1, dtype=np.int64)))
        c["ids"].append(ids_row_major)
        self.nnz += len(ids_row_major)

    def close(self) -> dict:
        for c in self.cols.values():
            c.close()
        fsync_dir(self.folder)
        return {"name": self.folder.name, "rows": self.rows, "ids": self.nnz}


def row_major(chunk: Chunk, features: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature CSR -> (lengths int32 [n, S], IDs row-major [nnz])."""
    n = chunk.rows
    offs = [np.asarray(chunk.sparse[f][1], np.int64) for f in features]
    lens = np.empty((n, len(features)), np.int32)
    for j, o in enumerate(offs):
        np.subtract(o[1:], o[:-1], out=lens[:, j], casting="unsafe")
    if n and features and lens.max() <= 1:  # one ID or none per feature (Criteo): a masked transpose
        present = lens.astype(bool)
        full = np.empty((len(features), n), np.int64)
        for j, f in enumerate(features):
            full[j][present[:, j]] = chunk.sparse[f][0]
        return lens, full.T[present]
    flat = lens.reshape(-1).astype(np.int64)
    total = int(flat.sum())
    # feature-major position of every ID, visited in row-major order
    src = np.concatenate([o[:-1] + b for o, b in zip(offs, np.cumsum([0] + [int(o[-1]) for o in offs[:-1]]))])
    src = src.reshape(len(features), n).T.reshape(-1)  # start of (row, feature) in the concatenation
    dst = np.zeros(len(flat), np.int64)
    np.cumsum(flat[:-1], out=dst[1:])
    pos = np.repeat(src - dst, flat) + np.arange(total, dtype=np.int64)
    ids = np.concatenate([np.asarray(chunk.sparse[f][0], np.int64) for f in features]) if features else np.zeros(0)
    return lens, ids[pos]


def convert(
    inputs: list[str] | str,
    fmt: str,
    out: str | os.PathLike,
    *,
    dense_transform: str = "log1p",
    shard_rows: int = 1 << 20,
    strict: bool = False,
    force: bool = False,
    chunk_bytes: int = 16 << 20,
    progress: Progress | None = None,
    **format_options,
) -> dict:
    """Convert `inputs` (paths or globs) into the dataset folder `out`; returns its manifest."""
    if dense_transform not in DENSE_TRANSFORMS:
        raise TraceError(f"--dense {dense_transform!r}: expected one of {', '.join(DENSE_TRANSFORMS)}")
    if shard_rows < 1:
        raise TraceError(f"--shard-rows must be positive, got {shard_rows}")
    files = expand_inputs(inputs)
    out = Path(out)
    _check_target(out, force)
    check_creatable(out)  # missing folders are created (foundation's rule for every output)
    # the writer lock sits beside the output (its folder made now, gone again if this fails); a second
    # conversion to `out` is refused, not raced
    with folders_for(out), one_writer_beside(out, "dataset folder"):
        _clear_leftovers(out)
        _check_target(out, force)  # again: another conversion may have ended while this one checked
        return _convert(files, fmt, out, dense_transform, shard_rows, strict, chunk_bytes, progress,
                        format_options)


def written_by_convert(folder: Path) -> bool:
    """A dataset folder `convert` wrote: its manifest names the dataset format (a folder that only
    holds some file named manifest.json is someone else's)."""
    if not is_dataset(folder):
        return False
    try:
        m = read_json(folder / MANIFEST, "dataset manifest")
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("format") == FORMAT


def _check_target(out: Path, force: bool) -> None:
    if os.path.lexists(out) and not force:
        raise TraceError(f"{out}: already exists (use --force to replace it)")
    if os.path.lexists(out) and (out.is_symlink() or not written_by_convert(out)):
        # --force replaces a dataset only: never a device, a FIFO (removing it would block),
        # a file or an unrelated folder
        raise TraceError(f"{out}: exists and is not a picasso dataset folder; refusing to replace it")


def _clear_leftovers(out: Path) -> None:
    """Remove what killed conversions to `out` left beside it; call with `out`'s writer lock held
    (their writers are gone: a live one would hold it)."""
    prefix = f".{out.name}."
    for entry in sorted(os.listdir(out.parent)):
        stem, _, pid = entry.rpartition("-")
        if not entry.startswith(prefix) or not pid.isdigit():
            continue
        if stem == f"{prefix}old" and not os.path.lexists(out) and is_dataset(out.parent / entry):
            os.rename(out.parent / entry, out)  # killed between moving the old dataset aside and the new in
        elif stem in (f"{prefix}converting", f"{prefix}old"):
            shutil.rmtree(out.parent / entry, ignore_errors=True)


def _convert(files, fmt, out: Path, dense_transform, shard_rows, strict, chunk_bytes, progress,
             format_options) -> dict:
    total_bytes = sum(os.path.getsize(f) for f in files if os.path.exists(f))
    tmp = out.parent / f".{out.name}.converting-{os.getpid()}"
    t0 = time.perf_counter()
    try:
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        manifest = _write(files, fmt, tmp, dense_transform, shard_rows, strict, chunk_bytes, progress,
                          total_bytes, format_options)
        manifest["seconds"] = round(time.perf_counter() - t0, 3)
        data = (json.dumps(manifest, indent=1) + "\n").encode()
        with open(tmp / MANIFEST, "wb") as f:  # the manifest last: it marks the folder complete
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fsync_dir(tmp)
        if out.exists():  # --force: the old dataset goes only once the new one is whole
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            os.rename(out, old)
            os.rename(tmp, out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(tmp, out)
        fsync_dir(out.parent)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and not isinstance(exc, TraceError) and exc.errno is not None:
            # a write error (ENOSPC, EIO) deep in a shard writer names no file: name the output
            raise TraceError(f"{out}: cannot write ({exc.strerror})") from None
        raise
    return manifest


def _write(files, fmt, tmp, dense_transform, shard_rows, strict, chunk_bytes, progress, total_bytes, opts) -> dict:
    features: list[str] | None = None
    dense_names: list[str] = []
    shards: list[dict] = []
    sources = []
    writer: _ShardWriter | None = None
    done_before = 0
    positives = 0
    for path in files:
        def report(done, _total, base=done_before):
            if progress is not None:
                progress(base + done, total_bytes)

        reader = open_reader(path, fmt, strict=strict, chunk_bytes=chunk_bytes, progress=report, **opts)
        if features is None:
            features, dense_names = list(reader.feature_names), list(reader.dense_names)
        elif list(reader.feature_names) != features or list(reader.dense_names) != dense_names:
            raise TraceError(f"{path}: its columns differ from {files[0]}'s (all inputs must share one layout)")
        for chunk in reader:
            n = chunk.rows
            if not n:
                continue
            lens, ids = row_major(chunk, features)
            dense = np.asarray(chunk.dense, np.float32).reshape(n, len(dense_names))
            if dense_transform == "log1p":
                dense = dlrm_dense(dense)
            labels = np.asarray(chunk.labels, np.float32)
            positives += int((labels > 0.5).sum())
            rowptr = np.zeros(n + 1, np.int64)
            np.cumsum(lens.sum(axis=1, dtype=np.int64), out=rowptr[1:])
            lo = 0
            while lo < n:  # cut the chunk at shard boundaries
                if writer is None:
                    writer = _ShardWriter(tmp / f"shard-{len(shards):05d}", len(dense_names), len(features))
                hi = min(n, lo + shard_rows - writer.rows)
                writer.append(labels[lo:hi], dense[lo:hi], lens[lo:hi], ids[rowptr[lo] : rowptr[hi]])
                lo = hi
                if writer.rows >= shard_rows:
                    shards.append(writer.close())
                    writer = None
        st = reader.stats
        sources.append({"path": os.path.abspath(path), "bytes": os.path.getsize(path), "rows": st.rows_ok,
                        "malformed_rows": st.rows_bad, "first_malformed": st.first_bad_reasons[:3]})
        done_before += os.path.getsize(path)
    if writer is not None and writer.rows:
        shards.append(writer.close())
    rows = sum(s["rows"] for s in shards)
    if rows == 0:
        raise TraceError(f"{files[0]}: no readable rows to convert")
    return {
        "format": FORMAT,
        "source_format": fmt,
        "rows": rows,
        "positives": positives,
        "label": "float32 0/1",
        "dense": dense_names,
        "dense_transform": dense_transform,
        "features": features,
        "ids": "raw int64 IDs as traces.readers reads them; the executor maps ID -> row (id % num_rows)",
        "malformed_rows": sum(s["malformed_rows"] for s in sources),
        "sources": sources,
        "shard_rows": shard_rows,
        "shards": shards,
    }
