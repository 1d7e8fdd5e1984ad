"""Triton kernels of the embedding step: table-batched pooling, and the backward's segment sums
fused with the sparse optimizer (the design of FBGEMM's table-batched embeddings).

Every kernel gives the same result whatever order its programs run in, which is what lets
Triton's interpreter (one program at a time, on CPU tensors) stand for the GPU in tests:
- pooling: one program owns a block of bags and writes only their outputs;
- segment sums: the step's (row, position) pairs are sorted once; the sorted positions are cut
  into fixed tiles. A tile sums its own positions per row (a one-hot matrix product, no
  atomics) and finishes every row that starts and ends inside it: the gradient row, or the
  optimizer's update of that table row, which no other program touches. A row whose run
  crosses tiles (a hot row hit 65,536 times a batch) is finished by a second kernel in the tile
  where the run starts, which adds the partial sums the following tiles left, in tile order.
So each row is written by exactly one program and every sum has a fixed order.

On a machine without CUDA the kernels run under the interpreter (`TRITON_INTERPRET=1` is set
here before Triton is imported); `executor.sparse.syncfree` calls them on CUDA tensors.
"""

from __future__ import annotations

import os
from enum import IntEnum

import torch

if not torch.cuda.is_available():  # the interpreter is the only way Triton runs here
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from executor.sparse.sorted_runs import sorted_runs  # noqa: E402

TILE = 64  # sorted positions per tile of the segment sums
BAGS = 32  # bags per program of the pooling
MAX_DIM = 1024  # one program holds a whole row (row-wise Adagrad reads its squared sum)


class SegmentOp(IntEnum):
    """What a finished row's summed gradient becomes."""

    WRITE = 0  # stored as the row's gradient
    SGD = 1  # weight[row] -= lr * g
    ROWWISE_ADAGRAD = 2  # state[row] += mean(g^2); weight[row] -= lr * g / (sqrt(state[row]) + eps)

    @classmethod
    def of_optimizer(cls, optimizer: str) -> SegmentOp:
        ops = {"sgd": cls.SGD, "rowwise_adagrad": cls.ROWWISE_ADAGRAD}
        if optimizer not in ops:
            raise ValueError(f"unknown sparse optimizer {optimizer!r}; expected one of {sorted(ops)}")
        return ops[optimizer]


def _block_dim(dim: int) -> int:
    if dim > MAX_DIM:
        raise ValueError(f"embedding dim {dim} is over {MAX_DIM}, the widest row the Triton kernels hold")
    return max(16, triton.next_power_of_2(dim))


# ---- pooling --------------------------------------------------------------------------------


@triton.jit
def _pool_kernel(rows, stride_r, idx, offsets, out, stride_o, num_bags, dim, pad_every,
                 MEAN: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_D: tl.constexpr):
    b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)
    bm = b < num_bags
    lo = tl.load(offsets + b, mask=bm, other=0)
    n = tl.load(offsets + b + 1, mask=bm, other=0) - lo
    # a padding bag (every pad_every-th) is read by nobody: skipped, not looped over serially
    n = tl.where((pad_every > 0) & (b % tl.maximum(pad_every, 1) == pad_every - 1), 0, n)
    d = tl.arange(0, BLOCK_D)
    dm = d < dim
    acc = tl.zeros([BLOCK_B, BLOCK_D], dtype=tl.float32)
    for j in range(0, tl.max(n, axis=0).to(tl.int32)):  # bags are far shorter than 2^31
        i = tl.load(idx + lo + j, mask=j < n, other=-1)
        # the mask built on full [B, D] tiles: one broadcast of a row mask with a column mask
        # inside the loop fails Triton 3.6's layout pass when the strides are multiples of 16
        i2 = i[:, None] + tl.zeros([BLOCK_B, BLOCK_D], dtype=tl.int64)
        d2 = d[None, :] + tl.zeros([BLOCK_B, BLOCK_D], dtype=tl.int32)
        acc += tl.load(rows + i2 * stride_r + d2, mask=(i2 >= 0) & (d2 < dim), other=0.0).to(tl.float32)
    if MEAN:
        acc = acc / tl.maximum(n, 1).to(tl.float32)[:, None]
    tl.store(out + b[:, None] * stride_o + d[None, :], acc, mask=bm[:, None] & dm[None, :])


def pool(rows: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: str,
         pad_every: int = 0) -> torch.Tensor:
    """Pooled bags [B, D] in fp32: bag b sums (or averages) rows[indices[offsets[b]:offsets[b+1]]];
    rows may be fp32, fp16 or bf16 (accumulated in fp32); empty bags give zeros. With
    `pad_every`, every pad_every-th bag (the padding of a static batch, Batch.pad_bags) gives
    zeros unread: one program would otherwise loop over all of its IDs alone."""
    if mode not in ("sum", "mean"):
        raise ValueError(f"pooling mode {mode!r} is not sum or mean")
    num_bags, dim = len(offsets) - 1, rows.shape[1]
    out = torch.empty(num_bags, dim, dtype=torch.float32, device=rows.device)
    if num_bags == 0:
        return out
    rows = rows if rows.stride(1) == 1 else rows.contiguous()
    grid = (triton.cdiv(num_bags, BAGS),)
    _pool_kernel[grid](rows, rows.stride(0), indices.contiguous(), offsets.contiguous(), out, out.stride(0),
                       num_bags, dim, int(pad_every), MEAN=mode == "mean", BLOCK_B=BAGS, BLOCK_D=_block_dim(dim))
    return out


# ---- segment sums and the fused update ----------------------------------------------------------


@triton.jit
def _noise(key, col, salt):
    """executor.sparse.lowp's draw in [0, 1) of (model-wide row `key`, column `col`), bit for bit:
    `salt` is its (step, seed) term, taken modulo 2**32 (every product is kept to 32 bits)."""
    h = ((key.to(tl.int64) & 0xFFFFFFFF) * 0x9E3779B1 + col.to(tl.int64) * 0x85EBCA77 + salt) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    h = (h * 0x45D9F3B) & 0xFFFFFFFF
    h = h ^ (h >> 16)
    return (h >> 8).to(tl.float32) / 16777216.0


@triton.jit
def _round_stochastic(x, u, DT: tl.constexpr):
    """fp32 `x` to the 16-bit `DT` as lowp.stochastic_round does: to nearest, then to the other
    neighbour (one step of the 16-bit pattern) with probability of the distance, by draw `u`.
    bf16's rounding to nearest (ties to even) is done on the bits, the same on every backend."""
    if DT == tl.bfloat16:
        xb = x.to(tl.int32, bitcast=True)
        bits = ((xb + 0x7FFF + ((xb >> 16) & 1)) >> 16) & 0xFFFF
        yf = (bits << 16).to(tl.float32, bitcast=True)
    else:
        bits = x.to(DT).to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
        yf = bits.to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    down = yf > x  # the other neighbour lies below
    away = down == (bits >= 0x8000)  # it is farther from zero
    other = tl.where((bits & 0x7FFF) == 0, tl.where(down, 0x8001, 0x0001),  # from zero: the least subnormal
                     tl.where(away, bits + 1, bits - 1))
    if DT == tl.bfloat16:
        of = (other << 16).to(tl.float32, bitcast=True)
    else:
        of = other.to(tl.int16).to(DT, bitcast=True).to(tl.float32)
    gap = tl.abs(of - yf)
    p = tl.where(gap > 0, tl.abs(x - yf) / gap, 0.0)
    return tl.where(u < p, other, bits).to(tl.int16).to(DT, bitcast=True)


@triton.jit
def _new_rows(wp, m, step, lr, rkey, col, salt, LOWP: tl.constexpr):
    """Store weight - lr * step where `m`; 16-bit rows (LOWP) rounded stochastically."""
    new = tl.load(wp, mask=m, other=0.0).to(tl.float32) - lr * step
    if LOWP:
        new = _round_stochastic(new, _noise(rkey, col, salt), wp.dtype.element_ty)
    tl.store(wp, new.to(wp.dtype.element_ty), mask=m)


@triton.jit
def _finish_rows(acc, segs, ok, dim, out, stride_out, keys, weight, stride_w, state, lr, eps, rkeys, salt, col0,
                 OP: tl.constexpr, BLOCK_D: tl.constexpr, LOWP: tl.constexpr):
    """The finished rows `segs` (mask `ok`) of a tile, [R, BLOCK_D] summed gradients."""
    d = tl.arange(0, BLOCK_D)
    m = ok[:, None] & (d < dim)[None, :]
    if OP == 0:
        tl.store(out + segs[:, None] * stride_out + d[None, :], acc, mask=m)
    else:
        row = tl.load(keys + segs, mask=ok, other=0)
        step = acc
        if OP == 2:
            s = tl.load(state + row, mask=ok, other=0.0) + tl.sum(acc * acc, axis=1) / dim
            tl.store(state + row, s, mask=ok)
            den = tl.sqrt(s) + eps
            step = tl.where(den[:, None] > 0, acc / den[:, None], 0.0)
        rkey = tl.load(rkeys + segs, mask=ok, other=0) if LOWP else row
        _new_rows(weight + row[:, None] * stride_w + d[None, :], m, step, lr, rkey[:, None], col0 + d[None, :], salt,
                  LOWP)


@triton.jit
def _tile_kernel(src, stride_src, src_row, seg, n, lengths, dim, out, stride_out, keys, weight, stride_w, state,
                 lr, eps, rkeys, salt, col0, head, tail,
                 MEAN: tl.constexpr, OP: tl.constexpr, TILE_N: tl.constexpr, BLOCK_D: tl.constexpr, LOWP: tl.constexpr):
    t = tl.program_id(0)
    start = t * TILE_N
    k = start + tl.arange(0, TILE_N)
    inb = k < n
    seg0 = tl.load(seg + start)
    local = tl.where(inb, tl.load(seg + k, mask=inb, other=0) - seg0, TILE_N)  # past the tile: no row
    r = tl.load(src_row + k, mask=inb, other=0)
    d = tl.arange(0, BLOCK_D)
    g = tl.load(src + r[:, None] * stride_src + d[None, :], mask=inb[:, None] & (d < dim)[None, :],
                other=0.0).to(tl.float32)
    if MEAN:
        g = g / tl.maximum(tl.load(lengths + r, mask=inb, other=1), 1).to(tl.float32)[:, None]
    s = tl.arange(0, TILE_N)
    # [row, D] sums as a one-hot product on tensor cores: the 0/1 matrix is exact in tf32 and
    # 3xTF32 splits g into two tf32 parts, which keeps fp32's accuracy (a plain fp32 product runs
    # on the FMA units: 64 x 64 x D multiply-adds per tile, 0.5 GFLOP a step at dim 128)
    acc = tl.dot((s[:, None] == local[None, :]).to(tl.float32), g, input_precision="tf32x3")
    last = tl.max(tl.where(inb, local, 0), axis=0)
    first_here = tl.load(seg + start - 1, mask=start > 0, other=-1) != seg0  # tile's first row starts here
    end = start + TILE_N
    last_ends = tl.load(seg + end, mask=end < n, other=-1) != seg0 + last  # tile's last row ends here
    # (tl.where, not `|`, joins a scalar with a vector: the interpreter keeps such masks boolean)
    ok = tl.where(first_here, s >= 0, s > 0) & tl.where(last_ends, s <= last, s < last)
    tl.store(head + t * BLOCK_D + d, tl.sum(tl.where(s[:, None] == 0, acc, 0.0), axis=0))
    tl.store(tail + t * BLOCK_D + d, tl.sum(tl.where(s[:, None] == last, acc, 0.0), axis=0))
    _finish_rows(acc, seg0 + s, ok, dim, out, stride_out, keys, weight, stride_w, state, lr, eps, rkeys, salt, col0,
                 OP, BLOCK_D, LOWP)


@triton.jit
def _cross_kernel(seg, n, run_end, dim, out, stride_out, keys, weight, stride_w, state, lr, eps, rkeys, salt, col0,
                  head, tail, OP: tl.constexpr, TILE_N: tl.constexpr, BLOCK_D: tl.constexpr, CHUNK: tl.constexpr,
                  LOWP: tl.constexpr):
    """Rows whose run leaves tile t, finished where the run starts: its tail plus the heads of
    the tiles it covers, added in tile order."""
    t = tl.program_id(0).to(tl.int64)  # one integer type for the loop's bounds
    start = t * TILE_N
    end = start + TILE_N
    seg0 = tl.load(seg + start)
    last_seg = tl.load(seg + tl.minimum(end, n) - 1)
    starts_here = (last_seg != seg0) | (tl.load(seg + start - 1, mask=start > 0, other=-1) != seg0)
    crosses = (end < n) & (tl.load(seg + end, mask=end < n, other=-1) == last_seg)
    own = starts_here & crosses
    hi = tl.where(own, (tl.load(run_end + t) + TILE_N - 1) // TILE_N, t + 1)  # tiles of the run: (t, hi)
    d = tl.arange(0, BLOCK_D)
    total = tl.load(tail + t * BLOCK_D + d)
    for u0 in range(t + 1, hi, CHUNK):
        u = u0 + tl.arange(0, CHUNK)
        um = u < hi
        total += tl.sum(tl.load(head + u[:, None] * BLOCK_D + d[None, :], mask=um[:, None], other=0.0), axis=0)
    # the one row as a tile of two whose second row is masked off: one finishing code for both kernels
    two = tl.arange(0, 2)
    first = tl.where(own, two == 0, two < 0)
    _finish_rows(tl.where(two[:, None] == 0, total[None, :], 0.0), last_seg + two * 0, first, dim, out, stride_out,
                 keys, weight, stride_w, state, lr, eps, rkeys, salt, col0, OP, BLOCK_D, LOWP)


def _segment_pass(src: torch.Tensor, src_row: torch.Tensor, seg: torch.Tensor, op: SegmentOp, *,
                  lengths: torch.Tensor | None = None, out: torch.Tensor | None = None,
                  keys: torch.Tensor | None = None, weight: torch.Tensor | None = None,
                  state: torch.Tensor | None = None, lr: float = 0.0, eps: float = 0.0,
                  row_keys: torch.Tensor | None = None, salt: int = 0, col0: int = 0) -> None:
    """Sum src[src_row[k]] (divided by lengths[src_row[k]] when given) over each run of equal
    `seg` (ascending, 0-based, no gaps) and finish every run by `op`: out[seg] = sum, or the
    optimizer's update of weight[keys[seg]] (and its state). A 16-bit weight is rounded as
    lowp.stochastic_round does, run s drawing with model-wide row row_keys[s] and columns from col0."""
    n, dim = len(seg), src.shape[1]
    if n == 0:
        return
    bd = _block_dim(dim)
    tiles = triton.cdiv(n, TILE)
    head = torch.empty(tiles, bd, dtype=torch.float32, device=src.device)
    tail = torch.empty_like(head)
    dummy = head  # a pointer for the arguments `op` does not read
    src = src if src.stride(1) == 1 else src.contiguous()
    o = out if out is not None else dummy
    w = weight if weight is not None else dummy
    low = row_keys is not None
    args = dict(dim=dim, out=o, stride_out=o.stride(0), keys=keys if keys is not None else seg, weight=w,
                stride_w=w.stride(0), state=state if state is not None else dummy, lr=float(lr), eps=float(eps),
                rkeys=row_keys if low else seg, salt=int(salt), col0=int(col0), LOWP=low)
    _tile_kernel[(tiles,)](src, src.stride(0), src_row, seg, n, lengths if lengths is not None else src_row,
                           head=head, tail=tail, MEAN=lengths is not None, OP=int(op), TILE_N=TILE, BLOCK_D=bd,
                           **args)
    if tiles > 1:
        # where the last row of each tile ends: the search needs no size read
        last = seg[torch.clamp(torch.arange(1, tiles + 1, device=seg.device) * TILE, max=n) - 1]
        run_end = torch.searchsorted(seg, last, right=True)
        _cross_kernel[(tiles,)](seg, n, run_end, head=head, tail=tail, OP=int(op), TILE_N=TILE, BLOCK_D=bd,
                                CHUNK=16, **args)


def _bag_sources(perm: torch.Tensor, offsets: torch.Tensor, mode: str) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The bag of every sorted ID position, and the bags' lengths where mean pooling divides by them."""
    lengths = offsets[1:] - offsets[:-1]
    bag_of = torch.repeat_interleave(torch.arange(len(lengths), device=offsets.device), lengths,
                                     output_size=len(perm))
    return bag_of[perm], lengths if mode == "mean" else None


def bag_grad_rows(grad_out: torch.Tensor, perm: torch.Tensor, seg: torch.Tensor, offsets: torch.Tensor,
                  mode: str, num_rows: int) -> torch.Tensor:
    """Gradient [num_rows, D] of each unique row from its bags' output gradients.

    `perm`/`seg` are the batch's dedup sort: perm[k] is the k-th ID position in row order and
    seg[k] its unique row. Rows past the last run stay zero."""
    src_row, lengths = _bag_sources(perm, offsets, mode)
    out = torch.zeros(num_rows, grad_out.shape[1], dtype=torch.float32, device=grad_out.device)
    _segment_pass(grad_out, src_row, seg, SegmentOp.WRITE, lengths=lengths, out=out)
    return out


def _check_update(weight: torch.Tensor, state: torch.Tensor | None, optimizer: str, low: bool = False) -> SegmentOp:
    op = SegmentOp.of_optimizer(optimizer)
    if weight.dtype != torch.float32 and not (low and weight.dtype in (torch.float16, torch.bfloat16)):
        raise ValueError(f"the fused update holds fp32 tables (16-bit ones with their row keys), not {weight.dtype}")
    if op == SegmentOp.ROWWISE_ADAGRAD and state is None:
        raise ValueError("rowwise_adagrad needs a state tensor")
    return op


def bag_update(grad_out: torch.Tensor, perm: torch.Tensor, seg: torch.Tensor, offsets: torch.Tensor, mode: str,
               rows: torch.Tensor, weight: torch.Tensor, state: torch.Tensor | None, optimizer: str, lr: float,
               eps: float) -> None:
    """The backward of a pooled lookup fused with the sparse optimizer: each unique row's
    gradient (summed from its bags, as `bag_grad_rows`) updates weight[rows[seg]] in the same
    pass; no gradient buffer, no second sort. `rows[s]` is unique row s's row of `weight`."""
    op = _check_update(weight, state, optimizer)
    src_row, lengths = _bag_sources(perm, offsets, mode)
    _segment_pass(grad_out, src_row, seg, op, lengths=lengths, keys=rows, weight=weight, state=state, lr=lr,
                  eps=eps)


def segment_sums(src: torch.Tensor, perm: torch.Tensor, seg: torch.Tensor) -> torch.Tensor:
    """fp32 sums [len(seg), D] of src[perm[k]] over each run of `seg`; rows past the last run are zero."""
    out = torch.zeros(len(seg), src.shape[1], dtype=torch.float32, device=src.device)
    _segment_pass(src, perm, seg, SegmentOp.WRITE, out=out)
    return out


@triton.jit
def _add_rows_kernel(dst, stride_d, idx, src, stride_s, n, dim, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    i = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.load(idx + i, mask=i < n, other=-1)
    d = tl.arange(0, BLOCK_D)
    m = (j >= 0)[:, None] & (d < dim)[None, :]
    p = dst + j[:, None] * stride_d + d[None, :]
    tl.store(p, tl.load(p, mask=m, other=0.0) + tl.load(src + i[:, None] * stride_s + d[None, :], mask=m, other=0.0),
             mask=m)


def add_rows(dst: torch.Tensor, idx: torch.Tensor, src: torch.Tensor) -> None:
    """dst[idx[i]] += src[i] for every idx[i] >= 0; the non-negative entries of `idx` are
    distinct (one program per row, no atomics), negative ones are skipped."""
    n, dim = len(idx), dst.shape[1]
    if n == 0:
        return
    src = src if src.stride(1) == 1 else src.contiguous()
    _add_rows_kernel[(triton.cdiv(n, TILE),)](dst, dst.stride(0), idx.contiguous(), src, src.stride(0), n, dim,
                                              BLOCK_N=TILE, BLOCK_D=_block_dim(dim))


def sparse_update(weight: torch.Tensor, state: torch.Tensor | None, rows: torch.Tensor, grads: torch.Tensor,
                  optimizer: str, lr: float, eps: float, grad_index: torch.Tensor | None = None, *,
                  keys: torch.Tensor | None = None, step: int = 0, seed: int = 0, col0: int = 0) -> None:
    """weight[rows] updated in place by the summed gradients of duplicate rows, the optimizer
    applied in the same pass as the sums. With `grad_index`, row i's gradient is
    grads[grad_index[i]] (read in place: a pooled bag's gradient shared by its lookups). A 16-bit
    weight needs `keys` (each row's model-wide number), `step` and `seed`: its rows are rounded
    as lowp.update_rows rounds them, columns numbered from `col0`."""
    op = _check_update(weight, state, optimizer, low=keys is not None)
    if rows.numel() == 0:
        return
    perm, seg, uniq = sorted_runs(rows)
    src_row = perm if grad_index is None else grad_index[perm]
    row_keys = None if keys is None else torch.zeros_like(uniq).scatter_(0, seg, keys.to(uniq.dtype)[perm])
    salt = (step * 0xC2B2AE3D + seed * 0x27D4EB2F) & 0xFFFFFFFF
    _segment_pass(grads, src_row, seg, op, keys=uniq, weight=weight, state=state, lr=lr, eps=eps, row_keys=row_keys,
                  salt=salt, col0=col0)


def self_check(device: torch.device) -> None:
    """Compile and run every kernel once on `device` against torch; raise if one fails or differs
    (a Triton that cannot build them here must leave the torch path, not fail a run later)."""
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 50, (300,), generator=g).to(device)
    ids[::3] = 7  # a run that crosses tiles
    offsets = torch.arange(0, 301, 3, device=device)
    w = torch.randn(50, 16, generator=g).to(device)
    grad_out = torch.randn(100, 16, generator=g).to(device)
    want = torch.nn.functional.embedding_bag(ids, w, offsets, mode="mean", include_last_offset=True)
    if not torch.allclose(pool(w, ids, offsets, "mean"), want, rtol=1e-4, atol=1e-5):
        raise RuntimeError("pooling differs from torch")
    perm, seg, uniq = sorted_runs(ids)
    gu = bag_grad_rows(grad_out, perm, seg, offsets, "sum", len(ids))
    bag = torch.arange(100, device=device).repeat_interleave(3)
    ref = torch.zeros(len(ids), 16, device=device).index_add_(0, seg, grad_out[bag][perm])
    if not torch.allclose(gu, ref, rtol=1e-4, atol=1e-4):
        raise RuntimeError("segment sums differ from torch")
    w2, s2 = w.clone(), torch.zeros(50, device=device)
    bag_update(grad_out, perm, seg, offsets, "sum", uniq, w2, s2, "rowwise_adagrad", 0.1, 1e-8)
    sparse_update(w.clone(), torch.zeros(50, device=device), ids, grad_out[bag], "sgd", 0.1, 0.0)
    add_rows(w.clone(), torch.full((4,), -1, device=device), w[:4])
    if not torch.isfinite(w2).all():
        raise RuntimeError("fused update gave non-finite rows")


def compile_for(arch: int = 90) -> dict[str, str]:
    """Compile every kernel ahead of time for CUDA compute capability `arch`, no GPU needed:
    kernel variant -> "ok" or the compiler's first error line. Pointers, strides and the
    dim are marked multiples of 16, as Triton marks them for real tables (what a compiler
    pass may treat differently from the interpreter). Needs the interpreter off (TRITON_INTERPRET=0)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("cuda", arch, 32)
    common = {"dim": "i32", "out": "*fp32", "stride_out": "i32", "keys": "*i64", "weight": "*fp32", "stride_w": "i32",
              "state": "*fp32", "lr": "fp32", "eps": "fp32", "rkeys": "*i64", "salt": "i64", "col0": "i32",
              "head": "*fp32", "tail": "*fp32"}
    variants = [("pool", _pool_kernel,
                 {"rows": "*bf16", "stride_r": "i32", "idx": "*i64", "offsets": "*i64", "out": "*fp32", "stride_o": "i32",
                  "num_bags": "i32", "dim": "i32", "pad_every": "i32", "MEAN": "constexpr", "BLOCK_B": "constexpr", "BLOCK_D": "constexpr"},
                 {"MEAN": True, "BLOCK_B": BAGS, "BLOCK_D": 16}),
                ("add_rows", _add_rows_kernel,
                 {"dst": "*fp32", "stride_d": "i32", "idx": "*i64", "src": "*fp32", "stride_s": "i32", "n": "i32",
                  "dim": "i32", "BLOCK_N": "constexpr", "BLOCK_D": "constexpr"}, {"BLOCK_N": TILE, "BLOCK_D": 16})]
    for op, low in [(op, False) for op in SegmentOp] + [(SegmentOp.ROWWISE_ADAGRAD, True), (SegmentOp.SGD, True)]:
        sig = dict(common, weight="*bf16" if low else "*fp32")
        name = op.name.lower() + ("_bf16" if low else "")
        variants.append((f"tile_{name}", _tile_kernel,
                         {"src": "*fp32", "stride_src": "i32", "src_row": "*i64", "seg": "*i64", "n": "i32",
                          "lengths": "*i64", **sig, "MEAN": "constexpr", "OP": "constexpr", "TILE_N": "constexpr",
                          "BLOCK_D": "constexpr", "LOWP": "constexpr"},
                         {"MEAN": True, "OP": int(op), "TILE_N": TILE, "BLOCK_D": 128, "LOWP": low}))
        variants.append((f"cross_{name}", _cross_kernel,
                         {"seg": "*i64", "n": "i32", "run_end": "*i64", **sig, "OP": "constexpr", "TILE_N": "constexpr",
                          "BLOCK_D": "constexpr", "CHUNK": "constexpr", "LOWP": "constexpr"},
                         {"OP": int(op), "TILE_N": TILE, "BLOCK_D": 16, "CHUNK": 16, "LOWP": low}))
    out = {}
    for name, fn, sig, consts in variants:
        sixteen = {(i,): [["tt.divisibility", 16]] for i, (a, ty) in enumerate(sig.items())
                   if ty.startswith("*") or a.startswith("stride") or a == "dim"}
        try:
            triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts, attrs=sixteen), target=target)
            out[name] = "ok"
        except Exception as e:  # the compiler's own error: reported, the caller decides
            lines = [ln.strip() for ln in str(e).splitlines() if "error" in ln.lower()] or [str(e).strip()[:200]]
            out[name] = lines[0][:300]
    return out
