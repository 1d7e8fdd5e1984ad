"""The sparse gradient all-gather (replicated packs, sparse hot sync) sends each rank's rows
and their gradients in one all_gather, and every rank gets every rank's rows back exactly."""

from __future__ import annotations

import pytest

from tests.shared_ranks import shared_call


def _worker(rank: int, world: int, dtype_name: str) -> tuple[int, list, list]:
    import torch
    import torch.distributed as dist

    from executor.comm import Comm

    calls = [0]
    real = dist.all_gather

    def spy(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)

    dist.all_gather = spy
    try:
        dtype = getattr(torch, dtype_name)
        n = 3 + 2 * rank  # unequal counts: the buffer is padded to the largest
        rows = torch.arange(n, dtype=torch.int64) * 2**40 + rank  # IDs past 32 bits
        vals = (torch.arange(n * 4, dtype=torch.float32).view(n, 4) / 7 - rank).to(dtype)
        vals[0, 0] = float("-inf") if dtype == torch.float32 else vals[0, 0]
        sizes = [3 + 2 * r for r in range(world)]
        got_rows, got_vals = Comm().start_all_gather_rows(rows, vals, async_op=True, sizes=sizes)()
    finally:
        dist.all_gather = real
    return calls[0], got_rows.tolist(), got_vals.float().tolist()


GATHERED = {dtype: shared_call(__name__, 3, _worker, dtype) for dtype in ("float32", "bfloat16")}


@pytest.mark.dist
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_rows_and_values_arrive_whole_in_one_gather_for_four_byte_values(dtype, shared_ranks):
    import torch

    out = shared_ranks(GATHERED[dtype])
    want_rows, want_vals = [], []
    for r in range(3):
        n = 3 + 2 * r
        want_rows += [i * 2**40 + r for i in range(n)]
        v = (torch.arange(n * 4, dtype=torch.float32).view(n, 4) / 7 - r).to(getattr(torch, dtype))
        if dtype == "float32":
            v[0, 0] = float("-inf")
        want_vals += v.float().tolist()
    for calls, rows, vals in out:
        assert rows == want_rows and vals == want_vals  # bit for bit
        assert calls == (1 if dtype == "float32" else 2)  # 2-byte values keep the two gathers
