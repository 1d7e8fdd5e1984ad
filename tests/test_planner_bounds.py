import pytest

from planner import op_names as on
from planner.access import table_access
from planner.bounds import dense_only_ops, embedding_free_us
from planner.explain import explain
from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from planner.search import evaluate
from simulator.hardware import load_hardware


def _plan(**kw) -> Plan:
    m = get_model("dlrm-criteo-kaggle")
    kw.setdefault("packs", [PackPlan("pack0", m.table_names)])
    return Plan(model=m, world_size=8, batch_size_per_rank=kw.pop("batch", 2048), **kw)


def test_dense_only_ops_drop_every_pack_op_and_hot_bytes():
    hw = load_hardware("dgx-h100")
    lo = lower(_plan(micro_batches=2, hot_rows={"C3": 1000}, hot_ids_file="x"), hw)
    ops = dense_only_ops(lo)
    names = {o.name for o in ops}
    assert names and all(on.split_name(n)[1] in ("dense", "input") for n in names)
    assert all(d in names for o in ops for d in o.deps)  # no dangling dependency
    ar = next(o for o in ops if o.name == "bwd/dense/allreduce")
    assert ar.collective[1] == pytest.approx(lo.dense.params * 4)  # the hot rows' gradients are gone
    # a micro-batch's bottom MLP waited for its pooled embeddings: now only for the input copy
    assert next(o for o in ops if o.name == "fwd/dense/bottom_mlp@mb1").deps == ["fwd/input/h2d"]


def test_serial_plan_chain_survives_and_bound_is_below_every_plan():
    hw = load_hardware("dgx-h100")
    m = get_model("dlrm-criteo-kaggle")
    acc = table_access(m)
    serial = _plan(kernel_interleaving=False)
    ops = [op for op in dense_only_ops(lower(serial, hw, access=acc)) if not op.args.get("pipelined")]
    for a, b in zip(ops, ops[1:]):
        assert a.name in b.deps  # the serial program stays serial through the removed ops
    free = embedding_free_us(serial, hw, acc)
    for plan in (serial, _plan(micro_batches=4, kernel_interleaving=True),
                 _plan(packs=[PackPlan("pack0", m.table_names, "table_wise", ranks=[0])])):
        ev = evaluate(plan, hw, acc, "simpy", True)
        assert ev.iteration_us > free
    # dense work is the same for every plan: the bound does not depend on the embedding plan
    assert embedding_free_us(_plan(micro_batches=1, kernel_interleaving=True), hw, acc) == pytest.approx(free, rel=0.02)


def test_explain_reports_the_bound_and_max_speedups():
    hw = load_hardware("dgx-h100")
    ex = explain(_plan(), hw)
    d = ex.to_dict()
    assert 0 < d["embedding_free_us"] < d["predicted_iteration_us"]
    for name, us in d["baselines_us"].items():
        if us:
            assert d["max_speedups"][name] == pytest.approx(us / d["embedding_free_us"])
            assert d["max_speedups"][name] > d["speedups"][name]
    assert "no plan beats that" in ex.text()


def test_the_bound_is_the_best_dense_choice_not_the_plans_own():
    # a plan with many micro-batches and DDP's buckets must not get a weaker bound (and so a
    # larger share of the way to it) than one with the best dense choices
    hw = load_hardware("dgx-h100")
    m = get_model("dlrm-criteo-kaggle")
    acc = table_access(m)
    plans = [_plan(micro_batches=8, kernel_interleaving=True, grad_bucket_mb=25.0), _plan(grad_bucket_mb=0.0),
             _plan(micro_batches=2, grad_bucket_mb=1.0, input_pipeline=True, ids_after_mb=0)]
    free = [embedding_free_us(p, hw, acc) for p in plans]
    assert free[0] == pytest.approx(free[1]) == pytest.approx(free[2])
    own = lower(plans[0], hw, access=acc, symmetric=True, check_memory=False)
    from planner.lowering import emit_graph
    from simulator.engine import simulate

    alone = simulate(emit_graph(dense_only_ops(own), 8, symmetric=True), hw).iteration_us
    assert free[0] < alone  # 8 micro-batches' dense work costs more than the best choice's
