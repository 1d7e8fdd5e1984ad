"""The Triton embedding kernels (executor.sparse.triton_tbe) against the torch path, under
Triton's interpreter on CPU tensors (on a GPU machine the same tests compile them for CUDA).

Fresh random inputs each: skewed IDs (one row repeated 50,000 times), empty and long bags, a
pack of tables of different row counts, both sparse optimizers, 16-bit rows, mean pooling;
then whole training steps routed through the kernels against the single-process reference.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

tbe = pytest.importorskip("executor.sparse.triton_tbe", reason="triton is not installed",
                          exc_type=ImportError)

from executor.comm import Comm  # noqa: E402
from executor.process.spawn import run_ranks  # noqa: E402
from executor.run.verify import equivalence_worker, synthetic_global_batches, train_and_compare  # noqa: E402
from executor.sparse import syncfree  # noqa: E402
from planner.builders import random_plan  # noqa: E402
from planner.model_spec import ModelSpec, TableSpec  # noqa: E402
from planner.plan import OptimizerPlan  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def bags(rng: np.random.Generator, num_bags: int, max_len: int) -> torch.Tensor:
    """CSR offsets with empty bags (length 0) and some long ones."""
    lengths = rng.integers(0, max_len + 1, num_bags)
    lengths[rng.integers(0, num_bags, 3)] = max_len * 8  # a few long bags
    return torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)])).to(DEV)


def skewed_ids(rng: np.random.Generator, n: int, rows: int, hot_share: float) -> torch.Tensor:
    ids = rng.integers(0, rows, n)
    ids[rng.random(n) < hot_share] = rng.integers(0, rows)
    return torch.from_numpy(ids).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_pool_matches_embedding_bag(dtype, mode):
    rng = np.random.default_rng()
    w = torch.randn(300, 24, device=DEV).to(dtype)
    offsets = bags(rng, 70, 5)
    idx = torch.from_numpy(rng.integers(0, 300, int(offsets[-1]))).to(DEV)
    want = F.embedding_bag(idx, w.float(), offsets, mode=mode, include_last_offset=True)
    got = tbe.pool(w, idx, offsets, mode)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pool_skips_the_padding_bags():
    """A static batch's padding (Batch.pad_bags) is every pad_every-th bag, holding many IDs
    that nobody reads: it comes back as zeros, every other bag as embedding_bag pools it."""
    rng = np.random.default_rng()
    w = torch.randn(50, 16, device=DEV)
    per = 9  # eight bags a table, then its padding
    offsets = bags(rng, 3 * per, 3)
    idx = torch.from_numpy(rng.integers(0, 50, int(offsets[-1]))).to(DEV)
    want = F.embedding_bag(idx, w, offsets, mode="sum", include_last_offset=True)
    want[per - 1 :: per] = 0
    torch.testing.assert_close(tbe.pool(w, idx, offsets, "sum", pad_every=per), want, rtol=1e-5, atol=1e-5)


# short runs; runs across tiles beside short ones; 50,000 IDs, each table one row (runs of 260 tiles).
# A second call's bits are compared on the first two (the 3,000 IDs' runs cross 11 tiles each: the
# same cross-tile sums, added in tile order, as the 50,000's, at a tenth of the interpreter's time)
@pytest.mark.parametrize("mode,n,hot_share,again", [("sum", 600, 0.0, True), ("mean", 3000, 0.7, True),
                                                    ("sum", 50_000, 1.0, False)])
def test_bag_backward_matches_index_add(mode, n, hot_share, again):
    rng = np.random.default_rng()
    # a pack: three tables of 5, 40 and 2,000 rows, bags table-major
    tables = [5, 40, 2000]
    per = n // len(tables)
    ids = torch.cat([skewed_ids(rng, per, r, hot_share) + sum(tables[:i]) for i, r in enumerate(tables)])
    lengths = torch.from_numpy(rng.integers(0, 4, len(ids))).to(DEV)
    lengths[-1] += len(ids) - int(lengths.sum()) if int(lengths.sum()) < len(ids) else 0
    cut = int(torch.searchsorted(lengths.cumsum(0), torch.tensor(len(ids), device=DEV)))
    lengths = lengths[: cut + 1]
    lengths[-1] -= int(lengths.sum()) - len(ids)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=DEV), lengths.cumsum(0)])
    grad_out = torch.randn(len(lengths), 16, device=DEV)
    d = syncfree.dedup_fixed(ids)
    want = syncfree.bag_grad_rows_fixed(grad_out.double(), d.inverse, offsets, mode, len(ids))
    got = tbe.bag_grad_rows(grad_out, d.perm, d.seg, offsets, mode, len(ids))
    # fp32 sums of up to 50,000 terms in another order than float64's: the error grows with the
    # terms' magnitudes, so the bound does (a dropped or doubled term is still far outside it)
    scale = syncfree.bag_grad_rows_fixed(grad_out.double().abs(), d.inverse, offsets, mode, len(ids))
    assert ((got.double() - want).abs() <= 2e-6 * scale + 1e-6).all()
    if again:
        assert torch.equal(got, tbe.bag_grad_rows(grad_out, d.perm, d.seg, offsets, mode, len(ids)))  # same bits


# each optimizer on short runs beside a long one; all short runs; one row's run through every tile
@pytest.mark.parametrize("optimizer,hot_share", [("sgd", 0.5), ("rowwise_adagrad", 0.5), ("sgd", 0.0),
                                                 ("rowwise_adagrad", 1.0)])
def test_fused_update_matches_torch(optimizer, hot_share):
    rng = np.random.default_rng()
    rows = skewed_ids(rng, 5000, 700, hot_share)
    grads = torch.randn(len(rows), 12, device=DEV)
    w0, s0 = torch.randn(700, 12, device=DEV), torch.rand(700, device=DEV)
    w1, s1, w2, s2 = w0.clone(), s0.clone(), w0.clone(), s0.clone()
    syncfree.sparse_update_fixed(w1, s1, rows, grads, optimizer, 0.05, 1e-4)
    tbe.sparse_update(w2, s2, rows, grads, optimizer, 0.05, 1e-4)
    torch.testing.assert_close(s2, s1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w2, w1, rtol=1e-5, atol=1e-4)  # sums of 5,000 in another order
    # the gradients read in place through an index (the pooled exchange's owner side)
    w3, s3 = w0.clone(), s0.clone()
    shared = torch.from_numpy(rng.integers(0, 50, len(rows))).to(DEV)
    w4, s4 = w0.clone(), s0.clone()
    with syncfree.triton_on():
        syncfree.sparse_update_indexed(w3, s3, rows, grads[:50], shared, optimizer, 0.05, 1e-4)
    syncfree.sparse_update_fixed(w4, s4, rows, grads[:50][shared], optimizer, 0.05, 1e-4)
    torch.testing.assert_close(w3, w4, rtol=1e-5, atol=1e-4)  # sums of 5,000 in another order
    untouched = torch.ones(700, dtype=torch.bool, device=DEV)
    untouched[rows] = False
    assert torch.equal(w2[untouched], w0[untouched]) and torch.equal(s2[untouched], s0[untouched])


def test_segment_sum_and_hot_rows():
    rng = np.random.default_rng()
    rows = skewed_ids(rng, 4000, 90, 0.8)
    g = torch.randn(len(rows), 20, device=DEV)
    with syncfree.triton_on():
        d, acc = syncfree.segment_sum(rows, g)
    want = torch.zeros(len(rows), 20, device=DEV).index_add_(0, d.inverse, g)
    torch.testing.assert_close(acc, want, rtol=1e-4, atol=1e-3)
    # distinct slots or -1: added without atomics, the skipped ones untouched
    slots = torch.from_numpy(np.where(rng.random(300) < 0.5, rng.permutation(300), -1)).to(DEV)
    src, dst = torch.randn(300, 20, device=DEV), torch.randn(300, 20, device=DEV)
    want = dst.clone().index_add_(0, slots.clamp(min=0), torch.where((slots >= 0).unsqueeze(1), src, 0.0))
    tbe.add_rows(dst, slots, src)
    torch.testing.assert_close(dst, want)


def test_unknown_optimizer_and_wide_rows_are_refused():
    w = torch.zeros(4, 8, device=DEV)
    with pytest.raises(ValueError, match="unknown sparse optimizer 'adam'"):
        tbe.sparse_update(w, None, torch.zeros(2, dtype=torch.int64), torch.zeros(2, 8), "adam", 0.1, 1e-8)
    with pytest.raises(ValueError, match="over 1024"):
        tbe.pool(torch.zeros(2, 2048), torch.zeros(1, dtype=torch.int64), torch.tensor([0, 1]), "sum")


OPTS = [OptimizerPlan("sgd", 0.5, "sgd", 0.1), OptimizerPlan("rowwise_adagrad", 0.1, "adagrad", 0.05, eps=1e-4)]


def small_model(dtype: str = "fp32") -> ModelSpec:
    tables = (TableSpec("C1", 6, 8, dtype=dtype), TableSpec("C2", 300, 8, dtype=dtype),
              TableSpec("C3", 90, 8, pooling="mean", pooling_factor=3.0, dtype=dtype))
    return ModelSpec("tiny", "dlrm", 13, tables, bottom_mlp=(16, 8), top_mlp=(16, 1))


@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_fused_bag_update_matches_backward_then_update(optimizer):
    rng = np.random.default_rng()
    ids = skewed_ids(rng, 4000, 500, 0.6)
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64, device=DEV),
                         torch.arange(2, len(ids) + 1, 2, device=DEV)])  # bags of two IDs
    grad_out = torch.randn(len(offsets) - 1, 16, device=DEV)
    d = syncfree.dedup_fixed(ids)
    w0, s0 = torch.randn(500, 16, device=DEV), torch.rand(500, device=DEV)
    w1, s1, w2, s2 = w0.clone(), s0.clone(), w0.clone(), s0.clone()
    gu = syncfree.bag_grad_rows_fixed(grad_out, d.inverse, offsets, "mean", len(ids))
    syncfree.sparse_update_fixed(w1, s1, d.uniq, gu, optimizer, 0.05, 1e-4)
    tbe.bag_update(grad_out, d.perm, d.seg, offsets, "mean", d.uniq, w2, s2, optimizer, 0.05, 1e-4)
    torch.testing.assert_close(s2, s1, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(w2, w1, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_training_through_triton_matches_reference(dtype, monkeypatch):
    """Whole steps with every kernel routed to Triton: the fused backward (one micro-batch, no
    hot rows), hot rows, micro-batches, both optimizers."""
    fused = []
    monkeypatch.setattr(tbe, "bag_update", lambda *a, **k: fused.append(1) or _bag_update(*a, **k))
    rng = np.random.default_rng()
    tol = 1e-5 if dtype == "fp32" else 2e-2
    for i, (mbs, hot) in enumerate([(1, "none"), (1, "some"), (2, "some")]):
        plan, hot_ids = random_plan(small_model(dtype), 1, 16, rng, micro_batches=mbs, optimizer=OPTS[i % 2],
                                    hot=hot)
        with syncfree.triton_on():  # on a GPU the CUDA tensors go to Triton anyway
            res = train_and_compare(plan, hot_ids, synthetic_global_batches(plan, 3, seed=i), Comm(torch.device(DEV)))
        assert res["max_rel_diff"] < tol and res["reference_moved"] > 1e-3, res
    assert bool(fused) == (dtype == "fp32")  # fused exactly where the rows are fp32


_bag_update = tbe.bag_update


@pytest.mark.dist
@pytest.mark.skipif(torch.cuda.is_available(), reason="gloo ranks hold CPU tensors: Triton runs them only interpreted")
def test_two_ranks_through_triton_match_reference(monkeypatch):
    monkeypatch.setenv(syncfree.TRITON_ENV, "all")  # the spawned ranks inherit it
    rng = np.random.default_rng(3)
    cases = []
    for i, sharding in enumerate(["row_wise", "table_wise"]):
        plan, hot = random_plan(small_model(), 2, 16, rng, sharding=sharding, micro_batches=2, optimizer=OPTS[i],
                                hot="some")
        cases.append((plan.to_dict(), hot, i, 2))
    for res in run_ranks(equivalence_worker, 2, cases)[0]:
        assert res["max_rel_diff"] < 1e-5 and res["reference_moved"] > 1e-3, res


@pytest.mark.parametrize("bad", ["negative", "short", "past_end"])
def test_bad_bags_are_refused_where_the_batch_is_built(bad):
    """The kernels trust offsets; a batch with broken ones is one DataError naming the table."""
    from executor.data.batches import DataError, RawBatch, to_batch

    model = ModelSpec("m", "dlrm", 1, (TableSpec("C1", 10, 4),), bottom_mlp=(4,), top_mlp=(1,))
    offsets = {"negative": [0, 2, 1, 3], "short": [0, 1, 3], "past_end": [0, 1, 2, 5]}[bad]
    raw = RawBatch(np.zeros(3, np.float32), np.zeros((3, 1), np.float32),
                   {"C1": (np.array([1, 2, -7]), np.array(offsets))})
    with pytest.raises(DataError, match="table C1: bag offsets"):
        to_batch(raw, model, {"C1": "C1"})
    ok = to_batch(RawBatch(raw.labels, raw.dense, {"C1": (np.array([1, 2, -7]), np.array([0, 1, 1, 3]))}),
                  model, {"C1": "C1"})
    assert ok.sparse["C1"][0].tolist() == [1, 2, 3]  # IDs land in the table (-7 mod 10)


def test_every_kernel_compiles_for_hopper():
    """The interpreter runs what the GPU compiler may refuse (a layout pass, an integer type):
    every kernel is compiled ahead of time for sm_90, with the multiple-of-16 hints real tables get."""
    import json
    import os
    import subprocess
    import sys

    code = "import json; from executor.sparse import triton_tbe as T; print(json.dumps(T.compile_for(90)))"
    env = {**os.environ, "TRITON_INTERPRET": "0"}  # JIT functions, not interpreted ones
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res and all(v == "ok" for v in res.values()), res


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("optimizer", ["sgd", "rowwise_adagrad"])
def test_fused_16bit_update_rounds_as_lowp(dtype, optimizer):
    """16-bit rows: sums, optimizer and lowp's stochastic rounding in one Triton pass, against
    lowp's torch rounding of the same sums: the same draws, so at most a rare one-step flip where
    the fp32 results differ in their last bits."""
    from executor.sparse import lowp

    rng = np.random.default_rng()
    rows = skewed_ids(rng, 3000, 400, 0.5)
    grads = torch.randn(len(rows), 8, device=DEV) * 1e-2
    keys = rows * 7 + 1000  # model-wide row numbers of the rows
    w0 = (torch.randn(400, 8, device=DEV) * 0.1).to(dtype)
    s0 = torch.rand(400, device=DEV)
    w1, s1, w2, s2 = w0.clone(), s0.clone(), w0.clone(), s0.clone()
    with syncfree.triton_on(False):
        lowp.update_rows(w1, s1, rows, grads, keys, optimizer, 0.5, 1e-4, step=3, seed=11)
    with syncfree.triton_on():
        lowp.update_rows(w2, s2, rows, grads, keys, optimizer, 0.5, 1e-4, step=3, seed=11)
    torch.testing.assert_close(s2, s1, rtol=1e-5, atol=1e-6)
    assert not torch.equal(w2, w0)
    diff = (w2.float() - w1.float()).abs()
    ulp = (torch.nextafter(w1, torch.full_like(w1, float("inf"))).float() - w1.float()).abs()
    assert bool((diff <= ulp * 1.01 + 1e-12).all()), float((diff / ulp).max())  # at most one step
    assert float((diff > 0).float().mean()) < 0.02  # and rarely: the draws are the same


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the keys' device matters only beside a GPU")
def test_row_keys_answer_on_the_rows_device():
    """A host-placed 16-bit pack updates its rows in host memory: their keys must be there
    too (a GPU run of such a plan failed in scatter_ with keys on the GPU, rows on the host)."""
    from executor.sparse.lowp import RowKeys

    m = ModelSpec("k", "dlrm", 4, (TableSpec("A", 10, 8), TableSpec("B", 20, 8)), bottom_mlp=(8,), top_mlp=(4, 1))
    keys = RowKeys(m, ["A", "B"], {"A": 0, "B": 10}, torch.device("cuda"))
    rows = torch.tensor([0, 9, 10, 29])
    got = keys(rows)
    assert got.device == rows.device and got.tolist() == keys(rows.cuda()).cpu().tolist()
