"""The safetensors file layout, written and read without the `safetensors` package.

A file is an 8-byte little-endian header length N, N bytes of JSON (per tensor its dtype,
shape and [begin, end) byte offsets into the data that follows; `__metadata__` a map of
strings to strings), then the tensors' bytes, row-major and little-endian, back to back.
Files written here load with `safetensors.torch.load_file`, and files it writes load here.
Tensors are written one at a time at their offsets, so a model is never held twice.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import BinaryIO

import torch

from foundation.documents import check_depth
from foundation.files import atomic_write

DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
          torch.int64: "I64", torch.int32: "I32", torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8",
          torch.bool: "BOOL"}
BY_NAME = {v: k for k, v in DTYPES.items()}
MAX_HEADER_BYTES = 100 << 20  # the reference implementation's own limit
ALIGN = 8


class SafetensorsError(ValueError):
    """A file that is not a well-formed safetensors file."""


@dataclass(frozen=True)
class Entry:
    """One tensor of a file: what it is and where its bytes lie in the data section."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


def layout(specs: dict[str, tuple[torch.dtype, tuple[int, ...]]]) -> dict[str, Entry]:
    """Offsets of tensors placed back to back in the order given."""
    out, at = {}, 0
    for name, (dtype, shape) in specs.items():
        n = numel(shape) * dtype.itemsize
        out[name] = Entry(dtype, tuple(int(d) for d in shape), at, at + n)
        at += n
    return out


def numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _header(entries: dict[str, Entry], metadata: dict[str, str]) -> bytes:
    doc: dict = {"__metadata__": metadata} if metadata else {}
    for name, e in entries.items():
        doc[name] = {"dtype": DTYPES[e.dtype], "shape": list(e.shape), "data_offsets": [e.begin, e.end]}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    raw += b" " * (-(len(raw) + 8) % ALIGN)  # the data starts aligned
    return struct.pack("<Q", len(raw)) + raw


def write(path: str | os.PathLike, entries: dict[str, Entry], metadata: dict[str, str],
          tensors: Callable[[], Iterator[tuple[str, torch.Tensor]]]) -> None:
    """Write `path` atomically: the header of `entries`, then each tensor `tensors()` yields
    (in any order) at its offset. Every entry must be yielded once, with its dtype and shape."""
    head = _header(entries, metadata)

    def body(f: BinaryIO) -> None:
        f.write(head)
        done = set()
        for name, t in tensors():
            e = entries[name]
            if name in done or t.dtype != e.dtype or tuple(t.shape) != e.shape:
                raise ValueError(f"tensor {name}: {t.dtype} {tuple(t.shape)} does not match its header entry "
                                 f"{e.dtype} {e.shape}" + (" (written twice)" if name in done else ""))
            f.seek(len(head) + e.begin)
            if e.end > e.begin:
                f.write(memoryview(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy()))
            done.add(name)
        missing = sorted(set(entries) - done)
        if missing:
            raise ValueError(f"tensor {missing[0]} was never written")

    atomic_write(path, body)


def read_header(f: BinaryIO, path: str | os.PathLike) -> tuple[dict[str, Entry], dict[str, str], int]:
    """The entries, metadata and data offset of an open file, checked against its size."""
    size = os.fstat(f.fileno()).st_size
    first = f.read(8)
    if len(first) < 8:
        raise SafetensorsError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
    (n,) = struct.unpack("<Q", first)
    if n > MAX_HEADER_BYTES or 8 + n > size:
        raise SafetensorsError(f"{path}: not a safetensors file (header length {n:,} for a {size:,}-byte file)")
    try:
        doc = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise SafetensorsError(f"{path}: not a safetensors file (its header is not JSON)") from None
    if not isinstance(doc, dict):
        raise SafetensorsError(f"{path}: not a safetensors file (its header is not a JSON object)")
    check_depth(doc, path, "safetensors header")
    meta = doc.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise SafetensorsError(f"{path}: header field __metadata__: expected a map of strings to strings")
    entries, data = {}, size - 8 - n
    for name, d in doc.items():
        try:
            dtype = BY_NAME[d["dtype"]]
            shape = tuple(d["shape"])
            begin, end = d["data_offsets"]
            ok = (all(isinstance(x, int) and x >= 0 for x in (*shape, begin, end))
                  and 0 <= begin <= end <= data and end - begin == numel(shape) * dtype.itemsize)
        except (KeyError, TypeError, ValueError):
            ok = False
        if not ok:
            raise SafetensorsError(f"{path}: header entry {name!r}: expected a known dtype, a shape and data "
                                   f"offsets that fit the file and the shape")
        entries[name] = Entry(dtype, shape, begin, end)
    return entries, meta, 8 + n


def read(path: str | os.PathLike) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Every tensor of a file (each its own memory) and its metadata."""
    with open(path, "rb") as f:
        entries, meta, start = read_header(f, path)
        out = {}
        for name, e in entries.items():
            buf = bytearray(e.end - e.begin)
            f.seek(start + e.begin)
            if f.readinto(buf) != len(buf):
                raise SafetensorsError(f"{path}: tensor {name!r} is cut short: the file is truncated")
            flat = torch.frombuffer(buf, dtype=torch.uint8) if buf else torch.empty(0, dtype=torch.uint8)
            out[name] = flat.view(e.dtype).reshape(e.shape)
    return out, meta
