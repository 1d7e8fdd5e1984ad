import numpy as np
import pytest

from planner import op_names as on
from planner.access import table_access
from planner.errors import PlanError
from planner.lowering import lower
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.engine import simulate
from simulator.hardware import load_hardware

KNOWN = {"fwd": set(on.INPUT_FWD) | set(on.PACK_FWD) | set(on.DENSE_FWD),
         "bwd": set(on.PACK_BWD) | set(on.DENSE_BWD), "opt": set(on.PACK_OPT) | set(on.DENSE_OPT)}


def hw8():
    return load_hardware("dgx-h100")


def kaggle_plan(**kw) -> Plan:
    m = get_model("dlrm-criteo-kaggle")
    kw.setdefault("packs", [PackPlan("pack0", m.table_names)])
    return Plan(model=m, world_size=8, batch_size_per_rank=kw.pop("batch", 2048), **kw)


def test_op_names_follow_the_shared_vocabulary_and_micro_batch_suffix():
    lo = lower(kaggle_plan(micro_batches=2, hot_rows={"C3": 100}, hot_ids_file="x"), hw8())
    names = [o.name for o in lo.ops]
    for n in names:
        phase, scope, op, mb = on.split_name(n)
        assert op in KNOWN[phase], n
        if phase == "opt" or op == "allreduce":
            assert mb is None, n  # once per iteration
    assert "fwd/pack0/a2a_ids@mb1" in names and "fwd/pack0/hot_gather@mb0" in names
    assert "bwd/dense/allreduce" in names and not any("hot_allreduce" in n for n in names)
    # the hot rows' gradients travel in the dense all-reduce: its buffer grows by exactly them
    plain = lower(kaggle_plan(micro_batches=2), hw8())
    fused, alone = lo.op("bwd/dense/allreduce"), plain.op("bwd/dense/allreduce")
    assert fused.collective[1] - alone.collective[1] == pytest.approx(100 * 16 * 4)
    assert "opt/pack0/hot_update" in names and lo.op("opt/pack0/hot_update").deps == ["bwd/dense/allreduce"]
    lo1 = lower(kaggle_plan(), hw8())
    assert "fwd/pack0/a2a_ids" in [o.name for o in lo1.ops]  # no suffix with one micro-batch


def test_volumes_follow_the_access_statistics():
    plan = kaggle_plan()
    acc = table_access(plan.model)
    lo = lower(plan, hw8(), access=acc)
    pv = lo.packs[0]
    expect = sum(acc[t].distinct(2048 * acc[t].pooling) for t in plan.model.table_names)
    assert pv.cold_unique == pytest.approx(expect)
    assert pv.a2a_emb_bytes.max() >= expect * 16 * 4 * 0.999
    # requests arriving at owners add up to what all ranks send
    assert pv.recv_ids.sum() == pytest.approx(8 * expect, rel=1e-6)
    # a hot set removes its rows from the exchange and covers its share of lookups
    hot = kaggle_plan(hot_rows={"C3": 1000}, hot_ids_file="x")
    pv_hot = lower(hot, hw8(), access=acc).packs[0]
    assert pv_hot.cold_unique < pv.cold_unique
    assert pv_hot.hot_lookups == pytest.approx(2048 * acc["C3"].pooling * acc["C3"].coverage_at(1000))
    assert pv_hot.bytes_saved_per_step(1) > 0


def test_table_wise_owner_pays_for_every_rank():
    m = get_model("dlrm-criteo-kaggle")
    tw = Plan(model=m, world_size=8, batch_size_per_rank=2048,
              packs=[PackPlan("p", m.table_names, "table_wise", [3])])
    pv = lower(tw, hw8()).packs[0]
    assert np.count_nonzero(pv.recv_ids) == 1 and pv.recv_ids[3] == pytest.approx(8 * pv.cold_unique)
    cold = [o for o in lower(tw, hw8(), symmetric=False).ops if o.name == "fwd/p/cold_gather"][0]
    assert list(cold.ranks) == [3]


def test_symmetric_graph_keeps_one_rank_and_predicts_the_same():
    plan = kaggle_plan(micro_batches=2, kernel_interleaving=True)
    hw = hw8()
    full = lower(plan, hw, symmetric=False)
    sym = lower(plan, hw, symmetric=True)
    assert full.graph.ranks() == list(range(8)) and sym.graph.ranks() == [0]
    a = simulate(full.graph, hw).iteration_us
    b = simulate(sym.graph, hw).iteration_us
    assert b == pytest.approx(a, rel=0.05)


def test_packing_and_interleaving_pay_off():
    hw = hw8()
    m = get_model("dlrm-criteo-kaggle")
    per_table = Plan(model=m, world_size=8, batch_size_per_rank=2048,
                     packs=[PackPlan(f"t{i}", [t]) for i, t in enumerate(m.table_names)])
    packed = kaggle_plan()
    t_tables = simulate(lower(per_table, hw, symmetric=True).graph, hw).iteration_us
    t_packed = simulate(lower(packed, hw, symmetric=True).graph, hw).iteration_us
    assert t_packed < t_tables
    half = m.table_names[:13], m.table_names[13:]
    two = [PackPlan("a", list(half[0])), PackPlan("b", list(half[1]))]
    serial = Plan(model=m, world_size=8, batch_size_per_rank=2048, packs=two)
    inter = Plan(model=m, world_size=8, batch_size_per_rank=2048, packs=[PackPlan("a", list(half[0])),
                                                                         PackPlan("b", list(half[1]))],
                 kernel_interleaving=True)
    t_serial = simulate(lower(serial, hw, symmetric=True).graph, hw).iteration_us
    t_inter = simulate(lower(inter, hw, symmetric=True).graph, hw).iteration_us
    assert t_inter < t_serial


def test_memory_infeasibility_names_rank_and_excess():
    m = ModelSpec("big", "dlrm", 4, (TableSpec("huge", 2_000_000_000, 64), TableSpec("small", 10, 64)),
                  bottom_mlp=(8, 64), top_mlp=(8, 1))
    plan = Plan(model=m, world_size=8, batch_size_per_rank=64,
                packs=[PackPlan("p0", ["huge"], "table_wise", [5]), PackPlan("p1", ["small"], "row_wise")])
    with pytest.raises(PlanError, match=r"rank 5 needs .* GiB but has .* \(over by .* GiB\)"):
        lower(plan, hw8())
    lo = lower(plan, hw8(), check_memory=False)
    assert not lo.memory.fits() and int(np.argmax(lo.memory.hbm_total)) == 5


def test_world_size_mismatch_is_a_clear_error():
    with pytest.raises(PlanError, match="plan is for 8 ranks but hardware"):
        lower(kaggle_plan(), load_hardware("local-cpu"))


def test_micro_batches_lower_activation_memory_and_host_placement_moves_tables(monkeypatch):
    from planner import lowering
    from planner.host_access import HostAccess

    m = get_model("dlrm-criteo-kaggle")
    one = lower(kaggle_plan(batch=8192), hw8()).memory.hbm["activations"].max()
    four = lower(kaggle_plan(batch=8192, micro_batches=4), hw8()).memory.hbm["activations"].max()
    assert four < one
    host = lower(kaggle_plan(packs=[PackPlan("pack0", m.table_names, placement="host")]), hw8())
    assert host.memory.hbm["tables"].max() == 0 and host.memory.host["cold_tables"].max() > 0
    # a GPU reads the rows in place over PCIe (mapped): one op
    assert np.max(host.op("fwd/pack0/cold_gather").demand["pcie_bytes"]) > 0
    # staged: the host gather and the PCIe copy are two ops, as the executor times them
    monkeypatch.setattr(lowering, "host_access", lambda kind: HostAccess.STAGED)
    host = lower(kaggle_plan(packs=[PackPlan("pack0", m.table_names, placement="host")]), hw8())
    gather, copy = host.op("fwd/pack0/cold_gather"), host.op("fwd/pack0/cold_h2d")
    assert np.max(gather.demand["host_bytes"]) > 0 and np.max(gather.demand["pcie_bytes"]) == 0
    assert np.max(copy.demand["pcie_bytes"]) > 0 and copy.deps == ["fwd/pack0/cold_gather"]


def test_dense_costs_follow_the_architecture():
    from planner.dense import dense_cost

    m = get_model("dlrm-criteo-kaggle")
    d = dense_cost(m)
    bottom = 2 * (13 * 512 + 512 * 256 + 256 * 16)
    assert d.ops["bottom_mlp"].flops == bottom
    f = 27  # 26 tables + the bottom MLP output
    assert d.ops["interaction"].flops == 2 * f * f * 16
    top_in = f * (f - 1) // 2 + 16
    assert d.ops["top_mlp"].flops == 2 * (top_in * 512 + 512 * 256 + 256 * 1)
    dcn = dense_cost(get_model("dcn-v2"))
    assert dcn.ops["interaction"].params == 3 * ((26 * 16 + 13) ** 2 + 26 * 16 + 13)
    din = dense_cost(get_model("din"))
    assert din.ops["interaction"].flops > 100 * din.ops["top_mlp"].flops / 10  # attention over ~150 items


def test_sequence_features_widen_the_pooled_output():
    din = get_model("din")
    plan = Plan(model=din, world_size=8, batch_size_per_rank=256, packs=[PackPlan("p", din.table_names[:4]),
                                                                          PackPlan("s", din.table_names[4:])])
    lo = lower(plan, hw8())
    assert lo.packs[1].pooled_width == 2 * 32 * 200 and lo.packs[0].pooled_width == 4 * 32


def test_tables_that_say_sgd_are_costed_with_the_plans_sparse_optimizer():
    """A plan training every table with row-wise Adagrad (tables declaring the default sgd)
    is costed with Adagrad's state bytes, as the executor runs it."""
    from executor.sparse.layout import pack_layout
    from planner.access import table_access
    from planner.model_spec import ModelSpec, TableSpec
    from planner.plan import OptimizerPlan, PackPlan, Plan
    from planner.volumes import pack_volumes

    m = ModelSpec("u", "dlrm", 2, (TableSpec("C1", 100, 4), TableSpec("C2", 50, 4)), bottom_mlp=(8, 4),
                  top_mlp=(8, 1))
    plan = Plan(m, 2, 16, [PackPlan("p", ["C1", "C2"], "row_wise")],
                optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "sgd", 0.1))
    pv = pack_volumes(plan, plan.packs[0], table_access(m), 16.0)
    assert pack_layout(plan, plan.packs[0], 0).optimizer == "rowwise_adagrad"
    assert pv.state_bytes == 4


def test_a_pooled_pack_saves_only_the_ids_of_its_hot_rows():
    # pooled at the owner, a hot row removes its ID from the exchange, but each bag's pooled
    # vector and its gradient travel anyway: --explain's "saved MB/step" must not count rows
    m = get_model("dlrm-criteo-kaggle")
    hot = {"C3": 1000}
    rows = Plan(model=m, world_size=8, batch_size_per_rank=2048, hot_rows=hot, hot_ids_file="x",
                packs=[PackPlan("p", m.table_names, "row_wise")])
    pooled = Plan(model=m, world_size=8, batch_size_per_rank=2048, hot_rows=hot, hot_ids_file="x",
                  packs=[PackPlan("p", m.table_names, "row_wise", exchange="pooled")])
    pv_rows, pv_pooled = lower(rows, hw8()).packs[0], lower(pooled, hw8()).packs[0]
    ids_saved = (pv_pooled.cold_unique_nohot - pv_pooled.cold_unique) * 4  # int32 IDs
    assert ids_saved > 0
    assert pv_pooled.bytes_saved_per_step(2) == pytest.approx(2 * ids_saved)
    rows_saved = (pv_rows.cold_unique_nohot - pv_rows.cold_unique) * (4 + 2 * 16 * 4)
    assert pv_rows.bytes_saved_per_step(1) == pytest.approx(rows_saved)


def test_a_dependency_issued_after_its_op_is_refused_not_dropped():
    # a program lists ops in issue order; a dependency on a later op was once dropped silently
    from planner.lowering import emit_graph
    from planner.program_ops import compute

    ops = [compute("fwd/pack0/route", ["fwd/pack0/dedup"], flops=1.0), compute("fwd/pack0/dedup", [], flops=1.0)]
    with pytest.raises(ValueError, match="fwd/pack0/route depends on fwd/pack0/dedup, which is issued after it"):
        emit_graph(ops, 2, symmetric=True)
    emit_graph(ops[::-1], 2, symmetric=True)
