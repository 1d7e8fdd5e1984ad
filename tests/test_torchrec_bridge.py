"""TorchRec bridge (both directions, every sharding type), table-row-wise sharding and its
hierarchical exchange, TorchRec's execution in lowering, and the DLRM-DCNv2 preset."""

from __future__ import annotations

import numpy as np
import pytest

from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from planner.torchrec_bridge import (
    INSTALL_HINT,
    plan_from_torchrec,
    torchrec_available,
    torchrec_sharding,
)
from tests.equivalence_cases import assert_shared_cases_match, shared_cases

needs_torchrec = pytest.mark.skipif(not torchrec_available(), reason="TorchRec is not installed (picasso[torchrec])")


def small_model(dim: int = 8) -> ModelSpec:
    rows = [40, 300, 1000, 7, 120, 64]
    tables = tuple(TableSpec(f"C{i + 1}", n, dim, pooling_factor=2.0 if i == 4 else 1.0) for i, n in enumerate(rows))
    return ModelSpec("tiny-dlrm", "dlrm", 13, tables, bottom_mlp=(16, dim), top_mlp=(16, 1))


def every_sharding_plan(world: int = 4) -> Plan:
    """One pack per sharding type (table-row-wise on node 1 of 2-rank nodes)."""
    return Plan(small_model(), world, 16, [
        PackPlan("rw", ["C1", "C2"], "row_wise"),
        PackPlan("tw", ["C3"], "table_wise", [2]),
        PackPlan("cw", ["C4"], "column_wise", [1, 3]),
        PackPlan("dp", ["C5"], "replicated"),
        PackPlan("twrw", ["C6"], "table_row_wise", [2, 3]),
    ])


def shardings(plan: Plan) -> dict[str, tuple]:
    return {t: (p.sharding, tuple(plan.pack_ranks(p)) if p.sharding != "replicated" else ())
            for p in plan.packs for t in p.tables}


def test_round_trip_every_sharding_type():
    plan = every_sharding_plan()
    neutral, lost = torchrec_sharding(plan)
    assert {d["sharding_type"] for d in neutral.values()} == {
        "row_wise", "table_wise", "column_wise", "data_parallel", "table_row_wise"}
    assert neutral["C4"]["shards"] == [[0, 0, 7, 4, 1], [0, 4, 7, 4, 3]]
    assert neutral["C6"]["shards"] == [[0, 0, 32, 8, 2], [32, 0, 32, 8, 3]]
    back = plan_from_torchrec(plan.model, plan.world_size, plan.batch_size_per_rank, neutral)
    assert shardings(back) == shardings(plan)
    assert back.exchange == "torchrec"
    # run as TorchRec runs it: pooled at the owner where the executor can
    assert {p.sharding: p.exchange for p in back.packs} == {
        "row_wise": "pooled", "table_wise": "pooled", "table_row_wise": "pooled", "column_wise": "rows",
        "replicated": "rows"}
    assert any("packed into one table" in x for x in lost)  # rw packs two tables


def test_export_lists_what_torchrec_cannot_express():
    plan = every_sharding_plan()
    plan.hot_rows, plan.hot_ids_file, plan.micro_batches, plan.kernel_interleaving = {"C2": 10}, "h.npz", 2, True
    plan.grad_bucket_mb = 1.0
    _, lost = torchrec_sharding(plan)
    text = " | ".join(lost)
    for what in ("hot-row replication", "2 micro-batches", "kernel interleaving", "cyclic row ownership",
                 "exchange of deduplicated rows", "bucket_cap_mb=1"):
        assert what in text
    plan.grad_bucket_mb = 25.0  # DDP's default: nothing to say
    assert not any("bucket" in x for x in torchrec_sharding(plan)[1])


def test_import_groups_fused_tables_and_lists_approximations():
    m = small_model()
    tw = lambda r: {"sharding_type": "table_wise", "compute_kernel": "fused", "ranks": [r], "shards": []}  # noqa: E731
    neutral = {"C1": tw(0), "C2": tw(0), "C3": tw(1),
               "C4": {"sharding_type": "table_column_wise", "compute_kernel": "fused", "ranks": [0, 0],
                      "shards": [[0, 0, 7, 4, 0], [0, 4, 7, 4, 0]]},
               "C5": {"sharding_type": "data_parallel", "compute_kernel": "dense", "ranks": None, "shards": []},
               "C6": {"sharding_type": "row_wise", "compute_kernel": "fused_uvm_caching", "ranks": [0, 1],
                      "shards": [[0, 0, 32, 8, 0], [32, 0, 32, 8, 1]]}}
    plan = plan_from_torchrec(m, 2, 16, neutral)
    by = {tuple(p.tables): p for p in plan.packs}
    assert by[("C1", "C2")].sharding == "table_wise" and by[("C1", "C2")].ranks == [0]
    assert by[("C6",)].placement == "host" and by[("C4",)].ranks == [0]
    approx = " | ".join(plan.provenance.torchrec["approximations"])
    assert "table_column_wise" in approx and "fused_uvm_caching" in approx
    with pytest.raises(PlanError, match="no sharding for table"):
        plan_from_torchrec(m, 2, 16, {k: v for k, v in neutral.items() if k != "C3"})
    with pytest.raises(PlanError, match="outside"):
        plan_from_torchrec(m, 2, 16, {**neutral, "C3": tw(5)})


def test_absent_torchrec_is_one_line(monkeypatch):
    import builtins

    from planner.builders import baseline_plan
    from simulator.hardware import load_hardware

    real = builtins.__import__

    def no_torchrec(name, *a, **kw):
        if name.startswith("torchrec"):
            raise ImportError(name)
        return real(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torchrec)
    with pytest.raises(PlanError) as exc:
        baseline_plan("torchrec", small_model(), 2, 16, load_hardware("local-cpu", ["gpus_per_node=2"]))
    assert str(exc.value) == INSTALL_HINT and "\n" not in INSTALL_HINT


# ---- table-row-wise and the hierarchical exchange ----------------------------------------------


def hw4():
    from simulator.hardware import load_hardware

    return load_hardware("dgx-h100", ["nodes=2", "gpus_per_node=2"])


def test_table_row_wise_must_stay_in_one_node():
    from planner.lowering import lower

    plan = Plan(small_model(), 4, 16, [PackPlan("a", small_model().table_names, "table_row_wise", [1, 2])])
    with pytest.raises(PlanError, match="inside one node"):
        lower(plan, hw4())


def test_table_row_wise_rows_are_lowered_as_the_executor_exchanges_them():
    # the executor runs a table-row-wise rows pack as row-wise over the node's ranks (no
    # per-node merge of requests), so lowering must not predict one
    from planner.access import table_access
    from planner.lowering import lower

    m = ModelSpec("z", "dlrm", 13, (TableSpec("A", 1_000_000, 64, pooling_factor=20.0),), bottom_mlp=(16, 64),
                  top_mlp=(16, 1))
    acc = table_access(m)
    flat = lower(Plan(m, 4, 4096, [PackPlan("p", ["A"], "row_wise", [2, 3])]), hw4(), access=acc)
    twrw = lower(Plan(m, 4, 4096, [PackPlan("p", ["A"], "table_row_wise", [2, 3])]), hw4(), access=acc)
    names = [o.name for o in twrw.ops if "/p/" in o.name]
    assert names == [o.name for o in flat.ops if "/p/" in o.name] and not any("_x" in n for n in names)
    for n in names:
        a, b = twrw.op(n), flat.op(n)
        assert (a.collective is None) == (b.collective is None)
        if a.collective is not None:
            assert np.allclose(a.collective[1], b.collective[1]), n
    assert np.allclose(twrw.packs[0].recv_ids, flat.packs[0].recv_ids)


def test_torchrec_execution_pipelines_the_input_exchange():
    from planner.access import table_access
    from planner.lowering import lower

    plan = every_sharding_plan()
    plan.exchange = "torchrec"
    lo = lower(plan, hw4(), access=table_access(plan.model))
    names = {o.name: o for o in lo.ops}
    ids = [o for o in lo.ops if o.name.endswith("/a2a_ids")]
    assert ids and all(o.lane == "input_dist" for o in ids)
    waited = {d for o in lo.ops for d in o.deps}
    assert not waited & {o.name for o in ids}  # nothing waits for the pipelined exchange
    assert names["fwd/tr_rw/a2a_emb"].collective[0] == "reduce_scatter" if "fwd/tr_rw/a2a_emb" in names else True
    kinds = {o.collective[0] for o in lo.ops if o.collective and "a2a_emb" in o.name}
    assert kinds == {"all_to_all", "reduce_scatter"}


# ---- DLRM-DCNv2 -------------------------------------------------------------------------------


def test_dcnv2_preset_and_low_rank_cost_match_the_executor():
    from executor.dense.model import build_dense
    from planner.dense import dense_cost
    from planner.presets import CRITEO_MULTIHOT_SIZES, get_model

    m = get_model("dlrm-dcnv2")
    assert [t.pooling_factor for t in m.tables] == list(CRITEO_MULTIHOT_SIZES) and {t.dim for t in m.tables} == {128}
    assert max(t.num_rows for t in m.tables) <= 40_000_000
    small = m.with_row_cap(50)
    net = build_dense(small, 0)
    assert sum(p.numel() for p in net.parameters()) == dense_cost(small).params
    full_rank = dense_cost(ModelSpec(**{**small.__dict__, "extra": {"cross_layers": 3}}))
    assert dense_cost(small).ops["interaction"].flops < 0.4 * full_rank.ops["interaction"].flops


# ---- execution: table-row-wise as row-wise over a node's ranks; DCNv2 under --verify -----------


def twrw_cases(world: int) -> list:
    from planner.presets import get_model

    m = small_model()
    g = world // 2
    node = lambda j: list(range(j * g, j * g + g))  # noqa: E731
    # Adagrad's first steps amplify fp32 rounding near eps (see test_executor_equivalence):
    # eps 1e-4 and a DCN-sized learning rate keep that under the tolerance
    opt = OptimizerPlan("rowwise_adagrad", 0.02, "adagrad", 0.01, eps=1e-4)
    a = Plan(m, world, 16, [PackPlan("n0", ["C1", "C2", "C3"], "table_row_wise", node(0)),
                            PackPlan("n1", ["C4", "C5", "C6"], "table_row_wise", node(1))],
             optimizer=opt, micro_batches=2)
    dcn = get_model("dlrm-dcnv2").with_row_cap(200)
    from dataclasses import replace

    dcn = replace(dcn, tables=tuple(replace(t, dim=8) for t in dcn.tables), bottom_mlp=(32, 8),
                  top_mlp=(32, 16, 1), extra={**dcn.extra, "cross_rank": 16})
    names = dcn.table_names
    b = Plan(dcn, world, 8, [PackPlan("n0", names[:13], "table_row_wise", node(0)),
                             PackPlan("n1", names[13:], "table_row_wise", node(1))], optimizer=opt)
    return [(a.to_dict(), {}, 0, 2), (b.to_dict(), {}, 1, 2)]


SHARED = {w: shared_cases(__name__, w, twrw_cases(w)) for w in (2, 4)}


@pytest.mark.dist
@pytest.mark.parametrize("world", [2, 4])
def test_table_row_wise_matches_reference(world, shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED[world], 1e-5,
                              lambda d: [(p["name"], p["sharding"]) for p in d["packs"]])


# ---- with TorchRec installed ---------------------------------------------------------------------


@needs_torchrec
def test_torchrec_planner_plan_converts_and_round_trips():
    from planner.access import table_access
    from planner.builders import baseline_plan
    from planner.search import evaluate
    from planner.torchrec_bridge import describe_sharding_plan, to_torchrec_objects
    from simulator.hardware import load_hardware

    m = ModelSpec("t", "dlrm", 13, tuple(TableSpec(f"C{i}", n, 64, pooling_factor=p) for i, (n, p) in
                                          enumerate([(5_000_000, 20.0), (3000, 1.0), (200_000, 3.0), (40, 1.0)])),
                  bottom_mlp=(64,), top_mlp=(64, 1))
    hw = load_hardware("dgx-h100", ["nodes=2", "gpus_per_node=4"])
    acc = table_access(m)
    plan = baseline_plan("torchrec", m, 8, 1024, hw, acc)
    assert plan.exchange == "torchrec" and plan.provenance.torchrec["planning_s"] > 0
    assert evaluate(plan, hw, acc).iteration_us > 0
    neutral, _ = torchrec_sharding(plan)
    constraints, sp = to_torchrec_objects(neutral, 4)
    assert set(constraints) == set(m.table_names)
    again = plan_from_torchrec(m, 8, 1024, describe_sharding_plan(sp))
    assert shardings(again) == shardings(plan)
