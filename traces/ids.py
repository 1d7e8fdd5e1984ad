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
MAX_VALUE_BYTES = 1 << 16  # one categorical value (a whole bag when multi-valued): real ones are a few bytes



_B80 = np.uint64(0x8080808080808080)
_B0F = np.uint64(0x0F0F0F0F0F0F0F0F)
_B20 = np.uint64(0x2020202020202020)
_LO4 = np.uint64(0x000F000F000F000F)
_U4, _U8 = np.uint64(4), np.uint64(8)


def _byte_range(w: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """0x80 in each byte of w (all bytes < 0x80) that lies in [lo, hi], else 0 (no carries)."""
    add_lo = np.uint64(int.from_bytes(bytes([0x80 - lo]) * 8, "little"))
    add_hi = np.uint64(int.from_bytes(bytes([0x7F - hi]) * 8, "little"))
    return (w + add_lo) & ~(w + add_hi) & _B80


def _swar_hex(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """8 ASCII hex chars per uint64 -> (8 nibbles, one per byte; valid flag per word)."""
    ascii7 = (w & _B80) == 0
    w7 = w & ~_B80
    digit = _byte_range(w7, 0x30, 0x39)
    letter = _byte_range(w7 | _B20, 0x61, 0x66)  # a-f, and A-F folded to lower case
    ok = ascii7 & ((digit | letter) == _B80)
    nib = (w7 & _B0F) + (letter >> np.uint64(7)) * np.uint64(9)
    return nib, ok


def string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets int32/int64 [n+1], data uint8, valid bool [n] or None) of a string/binary array."""
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        odt = np.int64
    elif pa.types.is_string(arr.type) or pa.types.is_binary(arr.type):
        odt = np.int32
    else:
        raise TypeError(f"not a string array: {arr.type}")
    bufs = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(bufs[1], dtype=odt, count=n + 1 + arr.offset)[arr.offset :]
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, np.uint8)
    valid = None
    if arr.null_count:
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    return offsets, data, valid


def parse_hex8_present(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Criteo categorical column -> (the present values' ids int64, in row order; present bool [n];
    bad bool [n]). Empty or null = missing (present False, bad False); anything but 8 hex chars = bad."""
    offsets, data, valid = string_buffers(arr)
    lengths = np.diff(offsets)
    present = lengths == 8
    bad = (lengths != 0) & ~present
    if valid is not None:
        present &= valid
        bad &= valid
    k = int(np.count_nonzero(present))
    if k == 0:
        return np.zeros(0, np.int64), present, bad
    start, end = int(offsets[0]), int(offsets[-1])
    if end - start == 8 * k and valid is None and not bad.any():
        # Fast path: every present value is 8 bytes and they sit back to back in the buffer.
        raw = data[start:end]
    else:
        pos = offsets[:-1][present]
        raw = data[(pos[:, None] + np.arange(8)).ravel()]
    w = raw.view("<u8")  # byte i = character i (most significant nibble first)
    nib, ok = _swar_hex(w)
    nonhex = ~ok
    # Pairs of nibbles -> bytes -> 16-bit halves -> 32 bits (little-endian lanes).
    w = ((nib & _LO4) << _U4) | ((nib >> _U8) & _LO4)
    w = ((w & np.uint64(0x000000FF000000FF)) << _U8) | ((w >> np.uint64(16)) & np.uint64(0x000000FF000000FF))
    w = ((w & np.uint64(0xFFFF)) << np.uint64(16)) | ((w >> np.uint64(32)) & np.uint64(0xFFFF))
    vals = w.view(np.int64)
    if nonhex.any():
        badidx = np.flatnonzero(present)[nonhex]
        bad[badidx] = True
        present[badidx] = False
        vals = vals[~nonhex]
    return vals, present, bad


VECTOR_HASH_BYTES = 256  # strings up to this long are hashed a byte position at a time across the array


def fnv1a64(arr: pa.Array) -> np.ndarray:
    """64-bit FNV-1a of each string's UTF-8 bytes, masked to non-negative int64. Linear in the bytes:
    short strings are hashed together one byte position per step, a longer one on its own (a step per
    position for one string would cost a numpy call per byte)."""
    offsets, data, _ = string_buffers(arr)
    lengths = np.diff(offsets)
    n = len(lengths)
    h = np.full(n, FNV_OFFSET, dtype=np.uint64)
    if n == 0:
        return h.view(np.int64)
    starts = offsets[:-1]
    long_rows = np.flatnonzero(lengths > VECTOR_HASH_BYTES)
    for r in long_rows:
        h[r] = _fnv1a64_one(data[int(starts[r]) : int(starts[r]) + int(lengths[r])].tobytes())
    with np.errstate(over="ignore"):
        # One vectorised step per byte position; rows shorter than j drop out.
        active = np.flatnonzero(lengths <= VECTOR_HASH_BYTES) if len(long_rows) else np.arange(n)
        maxlen = int(lengths[active].max()) if len(active) else 0
        for j in range(maxlen):
            active = active[lengths[active] > j]
            b = data[starts[active] + j].astype(np.uint64)
            h[active] = (h[active] ^ b) * FNV_PRIME
    return (h & INT63_MASK).view(np.int64)


def _fnv1a64_one(raw: bytes) -> np.uint64:
    h, prime, mask = int(FNV_OFFSET), int(FNV_PRIME), (1 << 64) - 1
    for b in raw:
        h = ((h ^ b) * prime) & mask
    return np.uint64(h)


def strings_to_ids(arr: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Generic categorical strings -> (ids int64 [n], present bool [n]); empty/null = missing."""
    t = arr.type
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) or pa.types.is_large_binary(t)):
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
        zero = pa.scalar(b"0" if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type) else "0", arr.type)
        dec = pc.cast(pc.if_else(pa.array(is_dec), arr, zero), pa.int64()).to_numpy(zero_copy_only=False)
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
