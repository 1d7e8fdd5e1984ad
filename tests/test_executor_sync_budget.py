"""A training step reads the device at most once: the sizes of its exchanges.

On a GPU every op whose result size depends on the data, and every read of a value back to
the host, stalls the host until the device catches up, so the step can no longer be queued
ahead of its kernels. This test counts, on CPU, the ops that would do that on CUDA while
steps of several plans run the device path (the torch kernels that CUDA uses): zero per
step on one rank, one per step on two ranks (the sizes of the step's all-to-alls).

A host-placed pack (placement "host") gathers its rows and applies its updates on the host,
so on a GPU its IDs (once per lookup) and its update's rows and gradients (once per step)
are read to the host: the counter counts each such transfer (ShardedPack.to_host) as a
read, and such a plan's budget is the above plus those (a zero-copy kernel reading mapped
host memory would remove the gathers' reads; that is measured in a GPU session).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from executor.comm import Comm
from executor.run.verify import local_rows, synthetic_global_batches
from executor.sparse import kernels
from executor.step.timing import OpTimer
from executor.step.trainer import Trainer
from planner.builders import random_plan
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from tests.shared_ranks import shared_call

aten = torch.ops.aten
# ops whose CUDA implementation copies a value or a size back to the host
SYNC_OPS = {
    aten._local_scalar_dense.default, aten.nonzero.default, aten._unique.default, aten._unique2.default,
    aten.unique_dim.default, aten.unique_consecutive.default, aten.masked_select.default,
    aten.bincount.default, aten.item.default,
}
REPEAT_INTERLEAVE = {aten.repeat_interleave.Tensor, aten.repeat_interleave.self_Tensor}
BOOL_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default}


class SyncCounter(TorchDispatchMode):
    """Counts host-synchronising ops (by name) and tensor-to-host conversions."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in SYNC_OPS:
            self.seen.append(str(func))
        elif func in REPEAT_INTERLEAVE and kwargs.get("output_size") is None:
            self.seen.append(f"{func} without output_size")
        elif func in BOOL_INDEXED and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else []) or []
        ):
            self.seen.append(f"{func} with a boolean mask")
        return func(*args, **kwargs)


class counting:
    """SyncCounter plus the conversions that bypass the dispatcher (tolist, numpy, cpu)."""

    def __enter__(self) -> SyncCounter:
        self.mode = SyncCounter()
        self.saved = {}
        from executor.sparse.embedding import ShardedPack

        orig = ShardedPack.to_host

        # what to_host returned is on the host: reading it reads no device (kept alive: ids stay unique)
        host_copies: dict[int, torch.Tensor] = {}

        def to_host(pack, *ts, _orig=orig):
            self.mode.seen.append("host: to_host")
            out = _orig(pack, *ts)
            host_copies.update((id(t), t) for t in out)
            return out

        self.to_host = orig
        ShardedPack.to_host = to_host
        for name in ("tolist", "numpy", "cpu"):
            orig = getattr(torch.Tensor, name)
            self.saved[name] = orig

            def wrapped(t, *a, _orig=orig, _name=name, **kw):
                if id(t) not in host_copies:
                    self.mode.seen.append(f"Tensor.{_name}")
                return _orig(t, *a, **kw)

            setattr(torch.Tensor, name, wrapped)
        self.mode.__enter__()
        return self.mode

    def __exit__(self, *exc) -> None:
        self.mode.__exit__(*exc)
        from executor.sparse.embedding import ShardedPack

        ShardedPack.to_host = self.to_host
        for name, orig in self.saved.items():
            setattr(torch.Tensor, name, orig)


def on_device(batch):
    """The batch as the device feeder hands it over: offsets known on the host too."""
    import dataclasses

    if not any(f.name == "host_offsets" for f in dataclasses.fields(batch)):
        return batch
    return dataclasses.replace(batch, host_offsets={t: o.numpy() for t, (_, o) in batch.sparse.items()})


def dlrm_model() -> ModelSpec:
    tables = [TableSpec(f"C{i + 1}", n, 8) for i, n in enumerate([40, 300, 1000, 7])]
    tables.append(TableSpec("C5", 120, 8, pooling_factor=3.0))  # multi-hot
    return ModelSpec("tiny-dlrm", "dlrm", 13, tuple(tables), bottom_mlp=(16, 8), top_mlp=(16, 1))


def din_model() -> ModelSpec:
    t = lambda n, r, d=8, **kw: TableSpec(n, r, d, **kw)  # noqa: E731
    return ModelSpec("tiny-din", "din", 0,
                     (t("user", 80), t("item", 500), t("hist_item", 500, pooling="none", max_len=6), t("cate", 40)),
                     top_mlp=(16, 1), extra={"attention_mlp": [8], "query": {"hist_item": "item"}})


ADAGRAD = OptimizerPlan("rowwise_adagrad", 0.1, "adagrad", 0.05, eps=1e-4)


def plans(world: int) -> list[tuple[str, dict, dict]]:
    """(label, plan dict, hot IDs): packing on and off, hot rows, row-wise, 2 micro-batches, every sharding."""
    rng = np.random.default_rng(3)
    m = dlrm_model()
    out = []
    for label, kw in [
        ("packed-rowwise-hot", dict(packing=True, sharding="row_wise", hot="some", micro_batches=1)),
        ("unpacked-mb2", dict(packing=False, hot="none", micro_batches=2)),
        ("replicated-hot", dict(packing=True, sharding="replicated", hot="some", micro_batches=2)),
        ("tablewise-allhot", dict(packing=False, sharding="table_wise", hot="all", micro_batches=1)),
    ]:
        plan, hot = random_plan(m, world, 16, rng, optimizer=ADAGRAD, **kw)
        out.append((label, plan.to_dict(), hot))
    mixed = Plan(
        m, world, 16,
        [PackPlan("a", ["C1", "C2"], "row_wise", ranks=list(range(world))[::-1]),
         PackPlan("b", ["C3"], "column_wise"), PackPlan("c", ["C4"], "replicated"),
         PackPlan("d", ["C5"], "table_wise", ranks=[world - 1])],
        hot_rows={"C2": 30, "C3": 500}, hot_ids_file="hot.npz", micro_batches=2, kernel_interleaving=True,
        optimizer=OptimizerPlan("sgd", 0.5, "sgd", 0.1),
    )
    out.append(("mixed", mixed.to_dict(), {"C2": np.arange(30) * 7 % 300, "C3": np.arange(500) * 2}))
    din, dhot = random_plan(din_model(), world, 16, rng, micro_batches=2, optimizer=ADAGRAD)
    out.append(("din-sequences", din.to_dict(), dhot))
    # a host-placed pack, 16-bit tables, sparse hot sync (its counts ride
    # in the step's one read)
    features = Plan.from_dict(mixed.to_dict())
    features.packs[0].placement = "host"
    features.packs[1].hot_sync = "sparse"
    features.packs[0].hot_sync = "sparse"
    out.append(("host-sparse-hot", features.to_dict(), {"C2": np.arange(30) * 7 % 300, "C3": np.arange(500) * 2}))
    # pooled exchange: the cold IDs per owner ride in the same read, lengths and pooled vectors
    # have sizes known from the batch shape
    pooled = Plan.from_dict(mixed.to_dict())
    for i in (0, 3):
        pooled.packs[i].exchange = "pooled"
    pooled.packs[0].hot_sync = "sparse"
    out.append(("pooled", pooled.to_dict(), {"C2": np.arange(30) * 7 % 300, "C3": np.arange(500) * 2}))
    pooled.packs[0].placement, pooled.packs[0].hot_sync = "host", "dense"
    out.append(("pooled-host", pooled.to_dict(), {"C2": np.arange(30) * 7 % 300, "C3": np.arange(500) * 2}))
    # fused, hierarchical pooled exchange (Plan.exchange "fused_pooled"): sizes from the same read
    fused = Plan.from_dict(mixed.to_dict())
    fused.exchange = "fused_pooled"
    for i, r in ((0, world - 1), (3, 0)):
        fused.packs[i].sharding, fused.packs[i].ranks, fused.packs[i].exchange = "table_row_wise", [r], "pooled"
    out.append(("fused-pooled", fused.to_dict(), {"C2": np.arange(30) * 7 % 300, "C3": np.arange(500) * 2}))
    low = dlrm_model()
    low = ModelSpec(low.name, low.arch, low.num_dense, tuple(
        TableSpec(t.name, t.num_rows, t.dim, dtype="bf16" if i % 2 else "fp16", pooling_factor=t.pooling_factor)
        for i, t in enumerate(low.tables)), bottom_mlp=low.bottom_mlp, top_mlp=low.top_mlp)
    plan16, hot16 = random_plan(low, world, 16, rng, packing=True, sharding="row_wise", hot="some",
                                micro_batches=2, optimizer=ADAGRAD)
    plan16.packs[0].hot_sync = "sparse"
    plan16.packs[-1].placement = "host"
    out.append(("16-bit", plan16.to_dict(), hot16))
    return out


def syncs_per_step(rank: int, world: int, cases: list, timed: bool) -> dict[str, list[list[str]]]:
    """Run 3 steps of every case on this rank (the first untimed, as warm-up); the syncs of the others."""
    kernels.use_reference()  # the torch kernels: what runs on a GPU
    comm = Comm()
    out = {}
    for label, plan_d, hot in cases:
        plan = Plan.from_dict(plan_d)
        timer = OpTimer(rank, comm.device, enabled=timed, micro_batches=plan.micro_batches)
        tr = Trainer(plan, hot, comm, timer)
        batches = [on_device(local_rows(b, plan, rank)) for b in synthetic_global_batches(plan, 3, seed=1)]
        tr.step(batches[0])
        seen = []
        for b in batches[1:]:
            with counting() as c:
                tr.step(b)
            seen.append(c.seen)
            timer.discard()
        out[label] = seen
    return out


def host_reads(plan_d: dict) -> tuple[int, int]:
    """Reads a step of a host-placed pack may make: one per lookup (gather), at least, and one
    per pack for its update (none on a rank whose update has no rows)."""
    n = sum(p.get("placement") == "host" for p in plan_d["packs"])
    return plan_d["micro_batches"] * n, (plan_d["micro_batches"] + 1) * n


def check_budget(result: dict[str, list[list[str]]], budget: int, cases: list) -> None:
    extra = {label: host_reads(plan_d) for label, plan_d, _ in cases}
    for label, steps in result.items():
        for seen in steps:
            lo, hi = extra[label]
            host = sum(s.startswith("host:") for s in seen)
            assert lo <= host <= hi, (label, seen)
            assert len(seen) - host <= budget, f"{label}: {len(seen)} host synchronisations in one step: {seen}"


@pytest.fixture
def device_path():
    """The test switches this process to the torch kernels; the next tests get the native ones back."""
    yield
    kernels.use_native()


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "op-timing"])
def test_one_rank_step_never_waits_for_the_device(timed, device_path):
    cases = plans(1)
    check_budget(syncs_per_step(0, 1, cases, timed), budget=0, cases=cases)


def syncs_then_native(rank: int, world: int, cases: list, timed: bool) -> dict[str, list[list[str]]]:
    """syncs_per_step, then the native kernels back (the shared group runs other tests' calls next)."""
    try:
        return syncs_per_step(rank, world, cases, timed)
    finally:
        kernels.use_native()


SYNCS = shared_call(__name__, 2, syncs_then_native, plans(2), False)


@pytest.mark.dist
def test_two_rank_step_reads_the_device_once(shared_ranks):
    cases = plans(2)
    for result in shared_ranks(SYNCS):
        check_budget(result, budget=1, cases=cases)
        # the one read is the sizes of the exchanges, and every multi-rank step needs it
        assert all([x for x in s if not x.startswith("host:")] == ["Tensor.tolist"]
                   for steps in result.values() for s in steps), result


def test_counter_sees_the_syncs_it_must():
    """The counter is not blind: each kind of host read it must catch is caught."""
    x = torch.tensor([3, 1, 2, 3])
    with counting() as c:
        x.tolist()
        torch.unique(x)
        torch.nonzero(x)
        x[x > 1]
        torch.repeat_interleave(x, x)
        torch.repeat_interleave(x, x, output_size=9)  # fine: the size is given
        float(x.sum())
    assert len(c.seen) == 6, c.seen
