"""Pieces of the executor: row ownership, deterministic init, batches, loader, optimizers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from executor.data.batches import (
    DataError,
    Prefetcher,
    RawBatch,
    feature_map,
    global_batches,
    rebatch,
    synthetic_raw,
    to_batch,
)
from executor.dense.optim import DenseOptimizer
from executor.sparse.layout import init_packed_rows, init_table_rows, pack_layout
from executor.step.trainer import pad_sequences
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan


def model() -> ModelSpec:
    t = (TableSpec("C1", 70_000, 4), TableSpec("C2", 10, 4), TableSpec("C3", 5, 6, pooling="none", max_len=3))
    return ModelSpec("u", "dlrm", 2, t)


def plan(sharding: str, ranks=None, world: int = 3) -> Plan:
    return Plan(model(), world, 8, [PackPlan("p", ["C1", "C2"], sharding, ranks=ranks), PackPlan("q", ["C3"])])


def test_row_wise_shards_are_cyclic_and_cover_every_row():
    p = plan("row_wise", ranks=[2, 0])
    rows = [pack_layout(p, p.packs[0], r).local_packed_rows() for r in range(3)]
    assert len(rows[1]) == 0  # rank 1 holds no shard of this pack
    assert rows[2][:3].tolist() == [0, 2, 4] and rows[0][:3].tolist() == [1, 3, 5]
    assert sorted(np.concatenate(rows).tolist()) == list(range(70_010))


def test_column_wise_splits_like_numpy_array_split():
    p = plan("column_wise")
    assert pack_layout(p, p.packs[0], 0).col_slices() == [(0, 2), (2, 3), (3, 4)]
    assert len(pack_layout(p, p.packs[0], 1).local_packed_rows()) == 70_010


def test_init_is_deterministic_and_shards_agree_with_the_whole_table():
    m = model()
    full = init_table_rows(m, "C1", seed=4)
    assert torch.equal(full, init_table_rows(m, "C1", seed=4))
    assert not torch.equal(full, init_table_rows(m, "C1", seed=5))
    rows = np.array([69_999, 3, 16_384, 0])
    assert torch.equal(init_table_rows(m, "C1", 4, rows), full[rows])
    bound = (1 / 70_000) ** 0.5
    assert full.abs().max() <= bound and full.std() > bound / 3
    p = plan("row_wise")
    lay = pack_layout(p, p.packs[0], 0)
    packed = np.array([70_003, 5])  # C2 row 3, C1 row 5
    got = init_packed_rows(m, lay, 4, packed)
    assert torch.equal(got[0], init_table_rows(m, "C2", 4)[3]) and torch.equal(got[1], full[5])


def raw(n: int) -> RawBatch:
    ids = np.arange(2 * n, dtype=np.int64) + 10**9
    off = np.arange(0, 2 * n + 1, 2, dtype=np.int64)
    sp = {"C1": (ids[:n], np.arange(n + 1, dtype=np.int64)), "C2": (ids, off), "C3": (ids, off)}
    return RawBatch(np.arange(n, dtype=np.float32), np.full((n, 2), np.nan, np.float32), sp)


def test_rebatch_cuts_exact_batches_across_chunks():
    out = list(rebatch([raw(5), raw(4), raw(6)], 6))
    assert [len(b) for b in out] == [6, 6]
    assert out[0].labels.tolist() == [0, 1, 2, 3, 4, 0]
    assert out[1].sparse["C2"][1].tolist() == [0, 2, 4, 6, 8, 10, 12]
    assert list(global_batches(lambda: iter([raw(5)]), 2, skip=1, epochs=2))[0].labels.tolist() == [2, 3]
    with pytest.raises(DataError, match="fewer rows"):
        next(global_batches(lambda: iter([raw(1)]), 2))


def test_to_batch_maps_ids_to_rows_and_clips_sequences():
    r = raw(3)
    r.sparse["C3"] = (np.arange(12, dtype=np.int64), np.array([0, 5, 5, 12]))
    b = to_batch(r, model(), feature_map(model(), r.sparse))
    assert b.sparse["C1"][0].tolist() == [(10**9 + i) % 70_000 for i in range(3)]
    rows, off = b.sparse["C3"]
    assert off.tolist() == [0, 3, 3, 6] and rows.tolist() == [0, 1, 2, 0, 1, 2]  # first max_len IDs, % 5
    assert torch.equal(b.dense, torch.zeros(3, 2))  # missing dense -> 0 -> log1p(0)
    sub = b.slice(1, 3)
    assert sub.sparse["C3"][1].tolist() == [0, 0, 3]


def test_feature_map_falls_back_to_the_numbered_feature_and_names_missing_ones():
    m = ModelSpec("w", "wide_deep", 0, (TableSpec("C1", 5, 2), TableSpec("W1", 5, 1)))
    assert feature_map(m, ["C1"]) == {"C1": "C1", "W1": "C1"}
    with pytest.raises(DataError, match="W1"):
        feature_map(ModelSpec("w", "wide_deep", 0, (TableSpec("W1", 5, 1),)), ["X"])


def test_pad_sequences_places_items_by_position():
    flat = torch.arange(5, dtype=torch.float32).unsqueeze(1)
    padded, mask = pad_sequences(flat, torch.tensor([0, 2, 2, 5]), 3)
    assert padded[:, :, 0].tolist() == [[0, 1, 0], [0, 0, 0], [2, 3, 4]]
    assert mask.tolist() == [[1, 1, 0], [0, 0, 0], [1, 1, 1]]


def test_prefetcher_runs_ahead_and_reraises():
    assert list(Prefetcher(iter(range(10)), depth=2)) == list(range(10))

    def bad():
        yield 1
        raise DataError("broken line 7")

    it = Prefetcher(bad())
    assert next(it) == 1
    with pytest.raises(DataError, match="line 7"):
        next(it)


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_dense_optimizers_follow_torch_optim(kind):
    torch.manual_seed(0)
    a = torch.randn(5, 3, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    ours = DenseOptimizer([a], kind, 0.1, eps=1e-8)
    ref = {"sgd": lambda: torch.optim.SGD([b], lr=0.1), "adagrad": lambda: torch.optim.Adagrad([b], lr=0.1, eps=1e-8),
           "adam": lambda: torch.optim.Adam([b], lr=0.1, eps=1e-8)}[kind]()
    for s in range(3):
        g = torch.randn(5, 3) * (s + 1)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_synthetic_rows_fit_every_table():
    m = model()
    r = synthetic_raw(m, 50, seed=0)
    b = to_batch(r, m, feature_map(m, r.sparse))
    assert len(b) == 50 and all(int(o[-1]) == len(x) for x, o in b.sparse.values())


def test_lower_triangle_dots_gradient_matches_autograd():
    """DLRM's interaction with its own backward gives the generic formulation's values and
    gradients (gradcheck in float64, and against the indexing it replaces)."""
    from executor.dense.interaction import LowerTriangleDots, triangle_maps

    f = 5
    li, lj = torch.tril_indices(f, f, offset=-1)
    tri, sym = triangle_maps(f)
    t = torch.randn(3, f, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: LowerTriangleDots.apply(x, tri, sym), (t,))
    g = torch.randn(3, len(tri), dtype=torch.float64)
    z = torch.bmm(t, t.transpose(1, 2))[:, li, lj]
    (want,) = torch.autograd.grad(z, t, g)
    out = LowerTriangleDots.apply(t, tri, sym)
    (got,) = torch.autograd.grad(out, t, g)
    assert torch.allclose(out, z) and torch.allclose(got, want)


def test_loss_log_stops_on_the_first_non_finite_step():
    from executor.step.timing import LossLog, NonFiniteLoss

    log = LossLog(first_step=10, every=3)
    log.add(torch.tensor(0.5))
    log.add(torch.tensor(0.4))
    with pytest.raises(NonFiniteLoss, match="at step 12"):
        log.add(torch.tensor(float("nan")))  # the third add reads the three back
    ok = LossLog(first_step=0, every=100)
    for v in (0.3, 0.2):
        ok.add(torch.tensor(v))
    assert ok.values() == pytest.approx([0.3, 0.2])


def test_diverging_run_exits_nonzero_naming_the_step(tmp_path, capsys):
    """A learning rate that blows the loss up ends the run with one line, not a NaN result."""
    from executor.run.worker import main
    from planner.builders import naive_plan
    from planner.model_spec import ModelSpec, TableSpec
    from planner.plan import OptimizerPlan

    m = ModelSpec("u", "dlrm", 2, (TableSpec("C1", 50, 4), TableSpec("C2", 30, 4)), bottom_mlp=(8, 4), top_mlp=(8, 1))
    plan = naive_plan(m, 1, 32)
    plan.optimizer = OptimizerPlan("sgd", 1e6, "sgd", 1e6)  # the largest rates a plan may name
    plan.save(tmp_path / "plan.json")
    from executor.run.config import RunConfig

    RunConfig(plan=str(tmp_path / "plan.json"), data="synthetic", steps=6, check_every=2).save(tmp_path / "c.json")
    rc = main([str(tmp_path / "c.json")])
    err = capsys.readouterr().err
    assert rc == 1 and "the loss became" in err and "at step" in err, err


def test_step_clock_counts_cpu_time_of_timed_steps_only():
    """CPU seconds per timed step: a busy timed step counts, an untimed (warm-up) one does not."""
    import time

    from executor.step.timing import StepClock

    def busy(seconds: float) -> None:
        end = time.process_time() + seconds
        while time.process_time() < end:
            pass

    clock = StepClock(torch.device("cpu"))
    assert clock.cpu_seconds_per_step() is None
    clock.start()
    busy(0.3)
    clock.stop(timed=False)
    for _ in range(2):
        clock.start()
        busy(0.05)
        clock.stop(timed=True)
    per_step = clock.cpu_seconds_per_step()
    assert 0.045 <= per_step < 0.15
