"""A counter-based generator for the tables' initial weights: the same bits on CPU and GPU.

Element (row, col) of a table under a seed is a pure function of (seed, table, row, col), so
any rank builds any rows on any device, in any order or chunking, and gets the same bits.
Draw k of the element is a 32-bit hash (lowbias32, the mixer found by Chris Wellons'
hash-prospector) of the counter c = (row * dim + col) * draws + k: its low 32 bits, xored
with the hash of (its row group, table key). A row group holds 2^s rows with 2^s * dim *
draws <= 2^32, so within a group the low halves never repeat and, the mixer being a
bijection, no two elements of a table share their 32 random bits.

The hash then becomes a float by exact steps: an integer below 2^24 converted to float32
(exact), then one multiply by a float32 constant (one IEEE rounding, its own kernel: no
fused multiply-add can change it).
- uniform (DLRM's): 24 random bits, in [-a, a) with a = 1/sqrt(rows);
- normal: the sum of four 22-bit uniforms (Irwin-Hall), rescaled to std 1/sqrt(dim): a bell
  bounded at 3.46 sigma, made of additions only (log and cos differ between CPU and GPU
  libraries, so Box-Muller would not give the same bits);
- zeros.

Two implementations of the one function: numpy's uint32 arithmetic (wraps by definition)
serves the CPU, where it runs several times faster than torch's integer kernels; torch's
int64 ops serve GPUs, keeping every value below 2^49 (products of a 32-bit value by a 16-bit
half of a constant), so nothing overflows. tests/test_init_rng.py checks they agree bit for
bit; a `gpu` test checks CUDA against the CPU.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from planner.model_spec import TableSpec

M32 = 0xFFFFFFFF
_C1, _C2 = 0x7FEB352D, 0x846CA68B  # lowbias32's multipliers
NORMAL_TERMS = 4  # uniforms summed per normal draw
UNIFORM_BITS, NORMAL_BITS = 24, 22


def init_scale(table: TableSpec) -> float:
    """Uniform bound / normal std of a table's initial weights (DLRM uses 1/sqrt(rows))."""
    if table.initializer == "uniform":
        return math.sqrt(1.0 / table.num_rows)
    return 1.0 / math.sqrt(table.dim)


def mix32_int(x: int) -> int:
    """lowbias32 of one 32-bit value (Python ints: the per-table key, computed on the host)."""
    x &= M32
    x ^= x >> 16
    x = (x * _C1) & M32
    x ^= x >> 15
    x = (x * _C2) & M32
    return x ^ (x >> 16)


def table_key(seed: int, table_index: int) -> int:
    """The 32-bit key of (seed, table): a seed of any size mixes into it."""
    k = mix32_int(table_index ^ 0x9E3779B9)
    for part in (seed & M32, (seed >> 32) & M32):
        k = mix32_int(k ^ part)
    return k


def group_shift(stride: int) -> int:
    """s: rows per group 2^s, the largest with 2^s * stride <= 2^32 (stride: counters per row)."""
    return 32 - (stride - 1).bit_length()


# ---- numpy (CPU) -------------------------------------------------------------------------

def _mix32_np(x: np.ndarray) -> np.ndarray:
    """lowbias32 of a uint32 array, in place."""
    x ^= x >> np.uint32(16)
    x *= np.uint32(_C1)
    x ^= x >> np.uint32(15)
    x *= np.uint32(_C2)
    x ^= x >> np.uint32(16)
    return x


def hash_np(rows: np.ndarray, stride: int, lo: int, hi: int, key: int) -> np.ndarray:
    """uint32 [len(rows), hi - lo]: the hash of counters row * stride + j, j in [lo, hi)."""
    rows = np.asarray(rows, dtype=np.int64)
    group = (rows >> group_shift(stride)).astype(np.uint32)
    gkey = _mix32_np(group ^ np.uint32(key))
    base = (rows.astype(np.uint64) * np.uint64(stride)).astype(np.uint32)  # mod 2^32
    with np.errstate(over="ignore"):
        x = base[:, None] + np.arange(lo, hi, dtype=np.uint32)[None, :]  # wraps mod 2^32
    x ^= gkey[:, None]
    return _mix32_np(x)


# ---- torch (any device) --------------------------------------------------------------------

def _mulmod32_(x: torch.Tensor, c: int) -> torch.Tensor:
    """x * c mod 2^32 for int64 x in [0, 2^32), in place, no intermediate past 2^49."""
    hi = (x * (c >> 16)).bitwise_and_(0xFFFF).bitwise_left_shift_(16)
    return x.mul_(c & 0xFFFF).add_(hi).bitwise_and_(M32)


def _mix32_t(x: torch.Tensor) -> torch.Tensor:
    """lowbias32 of int64 values in [0, 2^32), in place (x >= 0: >> is the logical shift)."""
    x.bitwise_xor_(x >> 16)
    _mulmod32_(x, _C1)
    x.bitwise_xor_(x >> 15)
    _mulmod32_(x, _C2)
    return x.bitwise_xor_(x >> 16)


def hash_torch(rows: torch.Tensor, stride: int, lo: int, hi: int, key: int) -> torch.Tensor:
    """hash_np's values as int64 [len(rows), hi - lo] on rows' device."""
    rows = rows.to(torch.int64)
    gkey = _mix32_t((rows >> group_shift(stride)).bitwise_and_(M32).bitwise_xor_(key))
    base = (rows * stride).bitwise_and_(M32)
    x = (base.unsqueeze(1) + torch.arange(lo, hi, dtype=torch.int64, device=rows.device)).bitwise_and_(M32)
    x.bitwise_xor_(gkey.unsqueeze(1))
    return _mix32_t(x)


# ---- the initial weights -------------------------------------------------------------------

def _f32(x: float) -> float:
    """x rounded to float32 (the multiplier both paths use)."""
    return float(np.float32(x))


def init_values(spec: TableSpec, table_index: int, seed: int, rows: torch.Tensor,
                cols: tuple[int, int] | None = None, use_torch: bool | None = None) -> torch.Tensor:
    """Initial float32 weights [len(rows), c1 - c0] of table-local `rows` (any order, on any
    device; the result is on theirs) and columns `cols` (default all). use_torch: the torch
    path (default: everywhere but the CPU)."""
    c0, c1 = cols if cols is not None else (0, spec.dim)
    n, width, dev = len(rows), c1 - c0, rows.device
    if spec.initializer == "zeros" or n == 0 or width == 0:
        return torch.zeros(n, width, dtype=torch.float32, device=dev)
    torch_path = dev.type != "cpu" if use_torch is None else use_torch
    draws = 1 if spec.initializer == "uniform" else NORMAL_TERMS
    stride, lo, hi = spec.dim * draws, c0 * draws, c1 * draws
    key = table_key(seed, table_index)
    if spec.initializer == "uniform":
        mult = _f32(init_scale(spec) / (1 << (UNIFORM_BITS - 1)))
        if torch_path:
            h = hash_torch(rows, stride, lo, hi, key)
            s = h.bitwise_right_shift_(32 - UNIFORM_BITS).sub_(1 << (UNIFORM_BITS - 1)).to(torch.float32)
            return s.mul_(mult)
        h = hash_np(rows.numpy(), stride, lo, hi, key)
        s = (h >> np.uint32(32 - UNIFORM_BITS)).view(np.int32) - np.int32(1 << (UNIFORM_BITS - 1))
        return torch.from_numpy(s.astype(np.float32) * np.float32(mult))
    # each 22-bit uniform has variance ~2^44 / 12, four of them ~2^44 / 3; their sum minus its
    # centre stays below 2^23 in magnitude: exact in float32
    mult = _f32(init_scale(spec) * math.sqrt(3.0) / (1 << NORMAL_BITS))
    centre = NORMAL_TERMS << (NORMAL_BITS - 1)
    if torch_path:
        h = hash_torch(rows, stride, lo, hi, key).bitwise_right_shift_(32 - NORMAL_BITS)
        total = h.view(n, width, NORMAL_TERMS).sum(-1).sub_(centre)
        return total.to(torch.float32).mul_(mult)
    h = hash_np(rows.numpy(), stride, lo, hi, key) >> np.uint32(32 - NORMAL_BITS)
    total = h.view(np.int32).reshape(n, width, NORMAL_TERMS).sum(-1, dtype=np.int32) - np.int32(centre)
    return torch.from_numpy(total.astype(np.float32) * np.float32(mult))
