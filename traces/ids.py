"""Turning raw categorical values into int64 IDs, vectorised over pyarrow string arrays.

Stable rules (the same value always gives the same ID, on every machine and run):
- Criteo: a value is exactly 8 hex characters; its ID is that hex number (0 .. 2**32-1).
- Other text formats (avazu, csv, parquet strings, libsvm/libfm indices): a value made only
  of decimal digits (optionally with a leading '-') and fitting int64 is kept as that
  integer (negative ones are masked like hashes); any other string gets the 64-bit FNV-1a
  hash of its UTF-8 bytes, masked to a non-negative int64 (`& 0x7FFF_FFFF_FFFF_FFFF`).
- Integer columns of Parquet are kept as they are (negative ones masked the same way).
The executor maps an ID to a table row as `id % num_rows`.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

INT63_MASK = np.uint64(0x7FFF_FFFF_FFFF_FFFF)
FNV_OFFSET = np.uint64(0xCBF29CE484222325)
FNV_PRIME = np.uint64(0x100000001B3)

# ASCII byte -> nibble value, 0x80 marks a non-hex byte (detected with one AND per 8 bytes).
_HEX_LUT = np.full(256, 0x80, dtype=np.uint8)
for _i, _c in enumerate(b"0123456789abcdef"):
    _HEX_LUT[_c] = _i
for _i, _c in enumerate(b"ABCDEF"):
    _HEX_LUT[_c] = 10 + _i


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets int64 [n+1], data uint8, valid bool [n] or None) of a string/binary array."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        odt = np.int64
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        odt = np.int32
    else:
        raise TypeError(f"not a string array: {arr.type}")
    bufs = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(bufs[1], dtype=odt, count=n + 1 + arr.offset)[arr.offset :].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = None
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return offsets, data, valid


def parse_hex8(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Criteo categorical column -> (ids int64 [n], present bool [n], bad bool [n]).

    Empty or null = missing (present False, bad False); anything but 8 hex chars = bad.
    """
    offsets, data, valid = string_buffers(arr)
    lengths = np.diff(offsets)
    present = lengths == 8
    bad = (lengths != 0) & ~present
    if valid is not None:
        present &= valid
        bad &= valid
    ids = np.zeros(len(lengths), dtype=np.int64)
    k = int(present.sum())
    if k == 0:
        return ids, present, bad
    start, end = int(offsets[0]), int(offsets[-1])
    if not bad.any() and valid is None and end - start == 8 * k:
        # Fast path: every present value is 8 bytes and they sit back to back in the buffer.
        raw = data[start:end]
    else:
        pos = offsets[:-1][present]
        raw = data[(pos[:, None] + np.arange(8)).ravel()]
    nib = _HEX_LUT[raw]
    w = nib.view(">u8").astype(np.uint64)  # nibble i in byte i, most significant first
    nonhex = (w & np.uint64(0x8080808080808080)) != 0
    # SWAR: squeeze eight 4-bit nibbles (one per byte) into one 32-bit number.
    w = (w | (w >> np.uint64(4))) & np.uint64(0x00FF00FF00FF00FF)
    w = (w | (w >> np.uint64(8))) & np.uint64(0x0000FFFF0000FFFF)
    w = (w | (w >> np.uint64(16))) & np.uint64(0xFFFFFFFF)
    vals = w.astype(np.int64)
    if nonhex.any():
        badidx = np.flatnonzero(present)[nonhex]
        bad[badidx] = True
        present[badidx] = False
        vals = vals[~nonhex]
    ids[present] = vals
    return ids, present, bad


def fnv1a64(arr: pa.Array) -> np.ndarray:
    """64-bit FNV-1a of each string's UTF-8 bytes, masked to non-negative int64."""
    offsets, data, _ = string_buffers(arr)
    lengths = np.diff(offsets)
    n = len(lengths)
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h.view(np.int64)
    starts = offsets[:-1]
    maxlen = int(lengths.max()) if n else 0
    with np.errstate(over="ignore"):
        # One vectorised step per byte position; rows shorter than j drop out.
        active = np.arange(n)
        for j in range(maxlen):
            active = active[lengths[active] > j]
            b = data[starts[active] + j].astype(np.uint64)
            h[active] = (h[active] ^ b) * FNV_PRIME
    return (h & INT63_MASK).view(np.int64)


def strings_to_ids(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Generic categorical strings -> (ids int64 [n], present bool [n]); empty/null = missing."""
    if not (pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)):
        arr = pc.cast(arr, pa.string())
    n = len(arr)
    offsets, _, valid = string_buffers(arr)
    present = np.diff(offsets) > 0
    if valid is not None:
        present &= valid
    ids = np.zeros(n, dtype=np.int64)
    if not present.any():
        return ids, present
    is_dec = pc.match_substring_regex(arr, r"^-?[0-9]{1,18}$")
    is_dec = np.asarray(is_dec.fill_null(False).to_numpy(zero_copy_only=False), dtype=bool) & present
    if is_dec.any():
        dec = pc.cast(pc.if_else(pa.array(is_dec), arr, pa.scalar("0")), pa.int64()).to_numpy(zero_copy_only=False)
        ids[is_dec] = (dec[is_dec].astype(np.uint64) & INT63_MASK).astype(np.int64)
    other = present & ~is_dec
    if other.any():
        ids[other] = fnv1a64(arr.filter(pa.array(other)))
    return ids, present


def ints_to_ids(values: np.ndarray) -> np.ndarray:
    """Integer IDs kept as they are; negatives masked to non-negative int64."""
    v = np.asarray(values)
    if v.dtype.kind == "u":
        return (v.astype(np.uint64) & INT63_MASK).astype(np.int64)
    v = v.astype(np.int64)
    neg = v < 0
    if neg.any():
        v = v.copy()
        v[neg] = (v[neg].view(np.uint64) & INT63_MASK).view(np.int64)
    return v
