"""The tables' initial weights (executor.sparse.init_rng, executor.sparse.layout): a pure
function of (seed, table, row, column), the same on the CPU path (numpy) and the GPU path
(torch integer ops), whatever the chunking, the order of rows or the sharding."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor.sparse import layout as layout_mod
from executor.sparse.init_rng import group_shift, hash_np, hash_torch, init_values
from executor.sparse.layout import init_packed_rows, init_table_rows, pack_layout
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def spec(initializer: str = "uniform", dim: int = 16, rows: int = 10**9) -> TableSpec:
    return TableSpec("T", rows, dim, initializer=initializer)


# rows on both sides of row-group boundaries (2^s rows per group) and far out
ROWS = torch.tensor([0, 1, 2, (1 << 24) - 1, 1 << 24, (1 << 26) + 3, (1 << 28) - 1, 1 << 28, 999_999_999])


@pytest.mark.parametrize("initializer", ["uniform", "normal"])
@pytest.mark.parametrize("dim", [1, 16, 100, 128])
@pytest.mark.parametrize("seed", [0, 7, (1 << 40) + 3])
def test_the_torch_path_gives_the_numpy_paths_bits(initializer, dim, seed):
    s = spec(initializer, dim)
    a = init_values(s, 3, seed, ROWS)
    b = init_values(s, 3, seed, ROWS, use_torch=True)
    assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b)
    cols = (dim // 3, dim - dim // 4)
    assert torch.equal(init_values(s, 3, seed, ROWS, cols, use_torch=True), a[:, cols[0] : cols[1]])


def test_no_two_counters_of_a_table_share_their_hash():
    stride = 16
    s = group_shift(stride)
    assert (1 << s) * stride == 1 << 32
    rows = np.arange((1 << s) - 2000, (1 << s) + 2000)  # across a group boundary
    h = hash_np(rows, stride, 0, stride, key=12345)
    assert len(np.unique(h)) == h.size
    assert np.array_equal(h.astype(np.int64), hash_torch(torch.from_numpy(rows), stride, 0, stride, 12345).numpy())


def test_seeds_and_tables_give_different_weights():
    s = spec()
    base = init_values(s, 0, 1, ROWS)
    assert not torch.equal(base, init_values(s, 0, 2, ROWS))
    assert not torch.equal(base, init_values(s, 1, 1, ROWS))


def test_uniform_values_fill_their_range_evenly():
    s = spec(rows=50_000, dim=32)
    w = init_values(s, 2, 5, torch.arange(s.num_rows))
    a = (1 / s.num_rows) ** 0.5
    assert w.min() >= -a and w.max() < a
    assert w.min() < -0.999 * a and w.max() > 0.999 * a
    counts = torch.histc(w, bins=20, min=-a, max=a)
    assert (counts / w.numel() - 0.05).abs().max() < 0.003  # 1.6M draws: about 0.0002 of noise
    assert abs(float(w.mean())) < 0.003 * a and float(w.std()) == pytest.approx(a / 3**0.5, rel=0.003)
    # neighbouring elements are not correlated
    assert abs(float(torch.corrcoef(torch.stack([w[:, :-1].flatten(), w[:, 1:].flatten()]))[0, 1])) < 0.005


def test_normal_values_have_the_tables_std_and_a_bell():
    s = spec("normal", dim=64, rows=20_000)
    w = init_values(s, 2, 5, torch.arange(s.num_rows)).flatten()
    std = 1 / 64**0.5
    assert abs(float(w.mean())) < 0.005 * std and float(w.std()) == pytest.approx(std, rel=0.005)
    assert float(w.abs().max()) <= 3.47 * std
    # within one sigma: 66.6% for four uniforms' sum (a normal has 68.3%, a uniform 57.7%)
    assert float((w.abs() < std).float().mean()) == pytest.approx(0.666, abs=0.005)


def test_chunked_generation_equals_the_whole_and_any_row_order(monkeypatch):
    m = ModelSpec("m", "dlrm", 2, (TableSpec("A", 5000, 8), TableSpec("B", 3000, 8, initializer="normal")))
    whole = {t: init_table_rows(m, t, 9) for t in ("A", "B")}
    monkeypatch.setitem(layout_mod.INIT_CHUNK_ELEMS, "cpu", 8 * 37)  # 37 rows per chunk
    for t in ("A", "B"):
        assert torch.equal(init_table_rows(m, t, 9), whole[t])
        rows = np.random.default_rng(0).permutation(m.table(t).num_rows)[:999]
        assert torch.equal(init_table_rows(m, t, 9, rows), whole[t][rows])


@pytest.mark.parametrize("sharding", ["row_wise", "table_wise", "column_wise", "replicated", "table_row_wise"])
def test_every_ranks_shard_is_the_matching_rows_of_the_whole_tables(sharding):
    tables = (TableSpec("A", 1001, 6), TableSpec("B", 77, 6), TableSpec("C", 513, 6, initializer="normal"))
    m = ModelSpec("m", "dlrm", 2, tables)
    plan = Plan(m, 3, 8, [PackPlan("p", ["A", "B", "C"], sharding)], seed=11)
    whole = torch.cat([init_table_rows(m, t, 11) for t in ("A", "B", "C")])
    seen = 0
    for rank in range(3):
        lay = pack_layout(plan, plan.packs[0], rank)
        packed = lay.local_packed_rows()
        c0, c1 = lay.col_slices()[lay.index] if lay.index >= 0 else (0, lay.dim)
        cols = (c0, c1) if sharding == "column_wise" else None
        got = init_packed_rows(m, lay, 11, packed, cols=cols)
        assert torch.equal(got, whole[torch.from_numpy(packed)][:, c0:c1])
        seen += got.numel()
    assert seen >= whole.numel()
    # a scattered set of rows (a hot cache) and a 16-bit copy
    hot = np.array([1077, 3, 1000, 1001, 500, 1590])
    lay = pack_layout(plan, plan.packs[0], 0)
    assert torch.equal(init_packed_rows(m, lay, 11, hot, dtype=torch.bfloat16), whole[hot].to(torch.bfloat16))


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("initializer", ["uniform", "normal"])
def test_cuda_gives_the_cpus_bits(initializer):
    s = spec(initializer, 128)
    dev = torch.device("cuda")
    assert torch.equal(init_values(s, 4, 3, ROWS.to(dev)).cpu(), init_values(s, 4, 3, ROWS))
    m = ModelSpec("m", "dlrm", 2, (TableSpec("A", 300_000, 128, initializer=initializer), TableSpec("B", 7, 128)))
    plan = Plan(m, 1, 8, [PackPlan("p", ["A", "B"], "row_wise")], seed=5)
    lay = pack_layout(plan, plan.packs[0], 0)
    packed = lay.local_packed_rows()
    on_gpu = init_packed_rows(m, lay, 5, packed, device=dev)
    assert on_gpu.device.type == "cuda"
    assert torch.equal(on_gpu.cpu(), init_packed_rows(m, lay, 5, packed))
    host = init_packed_rows(m, lay, 5, packed, compute=dev)  # a host-placed shard built on the GPU
    assert host.device.type == "cpu" and torch.equal(host, on_gpu.cpu())
