"""planner.kernel_passes: the kernels behind each lowered op, priced by the simulator.

Each rule is checked through what the simulator charges for it (simulator.compiled.op_costs:
per op, its fixed and flow time), under an H200 spec whose perf factors the test sets, so that
a rule that is missing or prices the wrong rate shows as a wrong figure. A CPU spec keeps every
perf factor at 1.0: the rules' rate classes change nothing there.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from planner import kernel_passes
from planner.access import ZipfAccess, table_access
from planner.lowering import lower
from planner.model_spec import ModelSpec
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.compiled import op_costs
from simulator.hardware import load_hardware

ONE_H200 = ["nodes=1", "gpus_per_node=1"]
BATCH = 1024


def h200(*overrides: str):
    return load_hardware("h200", ONE_H200 + list(overrides))


def lowered(model: str | ModelSpec = "dlrm-criteo-kaggle", hw=None, batch: int = BATCH, access=None, **kw):
    m = model if isinstance(model, ModelSpec) else get_model(model).with_row_cap(50_000)
    plan = Plan(model=m, world_size=1, batch_size_per_rank=batch, packs=[PackPlan("p", m.table_names)], **kw)
    return lower(plan, hw or h200(), access=access)


def costs(lo, hw) -> dict[str, tuple[float, float]]:
    """(fixed us, flow us) per op name of rank 0."""
    return {k.split(":", 1)[1]: v for k, v in op_costs(lo.graph, hw).items() if k.startswith("0:")}


def stream_us(nbytes: float, hw) -> float:
    return nbytes / (hw.gpu.hbm_bw * hw.perf.hbm_stream) * 1e6


def test_every_op_counts_the_kernels_the_executor_launches():
    hw = h200()
    lo = lowered(hw=hw, hot_rows={"C3": 100}, hot_ids_file="x")
    m = get_model("dlrm-criteo-kaggle")
    bottom, top = len(m.bottom_mlp), len(m.top_mlp)
    want = {
        # per linear layer: GEMM (bias fused) + activation; backward: two GEMMs, the
        # activation's gradient and the bias gradient's reduction
        "fwd/dense/bottom_mlp": 2 * bottom, "bwd/dense/bottom_mlp": 4 * bottom,
        "fwd/dense/top_mlp": 2 * top, "bwd/dense/top_mlp": 4 * top,
        "fwd/p/dedup": 6, "fwd/p/hot_gather": 2, "fwd/p/cold_gather": 2, "fwd/p/pool": 2,
        # the backward's pool: its own 2, a 4-pass radix sort, run-length encoding (2)
        "bwd/p/pool": 2 + 4 + 2,
        "opt/p/cold_update": 3, "opt/p/hot_update": 2,
    }
    got = {o.name: kernel_passes.describe(o).get("launch") for o in lo.ops}
    assert {k: got.get(k) for k in want} == want
    # the simulator charges the kernel gap once per kernel
    c = costs(lo, hw)
    assert c["fwd/p/dedup"][0] == pytest.approx(6 * hw.gpu.launch_us)
    slow = h200("gpu.launch_us=10")
    assert costs(lowered(hw=slow), slow)["fwd/p/dedup"][0] == pytest.approx(60.0)


def test_mlp_stages_are_skinny_gemms_with_their_passes_streamed_after_them():
    hw = h200("perf.gemm.fp32.skinny=0.05")
    lo = lowered(hw=hw)
    m = get_model("dlrm-criteo-kaggle")
    c = costs(lo, hw)
    for stage, layers in (("bottom_mlp", m.bottom_mlp), ("top_mlp", m.top_mlp)):
        op = lo.op(f"fwd/dense/{stage}")
        # tall-skinny GEMMs: at a skinny fraction this low, their FLOPs set the op's time
        assert c[f"fwd/dense/{stage}"][1] == pytest.approx(op.demand["flops"] / (67e12 * 0.05) * 1e6)
        # bias + activation: per layer output, one read and one write of fp32 per sample,
        # after the GEMM (a fixed part at the streaming rate); the backward passes twice as many
        passes = BATCH * sum(layers) * 4 * 2
        for phase, n in (("fwd", 1), ("bwd", 2)):
            fixed, _ = c[f"{phase}/dense/{stage}"]
            launches = kernel_passes.dense_kernels(m, stage, phase == "bwd")
            assert fixed == pytest.approx(launches * hw.gpu.launch_us + stream_us(n * passes, hw))
    # streaming, not random rows: a slower random-row rate leaves them as they were
    slow_random = h200("perf.gemm.fp32.skinny=0.05", "perf.hbm_random=0.1")
    c2 = costs(lowered(hw=slow_random), slow_random)
    assert c2["bwd/dense/top_mlp"] == pytest.approx(c["bwd/dense/top_mlp"])
    # 16-bit activations halve the passes
    bf_model = get_model("dlrm-criteo-kaggle").with_row_cap(50_000)
    bf_model = replace(bf_model, extra={**bf_model.extra, "dense_dtype": "bf16"})
    bf = lower(Plan(model=bf_model, world_size=1, batch_size_per_rank=BATCH,
                    packs=[PackPlan("p", bf_model.table_names)]), hw)
    assert bf.op("fwd/dense/top_mlp").args["fixed_hbm_bytes"] == pytest.approx(BATCH * sum(m.top_mlp) * 4)


def test_cross_layers_are_skinny_gemms_too():
    m = get_model("dcn-v2")
    assert m.arch == "dcn" and m.cross_layers == 3
    slow_skinny, slow_square = h200("perf.gemm.fp32.skinny=0.02"), h200("perf.gemm.fp32.square=0.02")
    a = lowered("dcn-v2", hw=slow_skinny)
    op = a.op("fwd/dense/interaction")
    assert kernel_passes.describe(op)["eff_key"] == "gemm"
    flow_skinny = costs(a, slow_skinny)["fwd/dense/interaction"][1]
    flow_square = costs(lowered("dcn-v2", hw=slow_square), slow_square)["fwd/dense/interaction"][1]
    assert flow_skinny == pytest.approx(op.demand["flops"] / (67e12 * 0.02) * 1e6)
    assert flow_square < flow_skinny / 5  # the square class does not apply to a batch of rows
    # 3 cross layers: forward 4 kernels each, backward 7
    assert op.args["launch"] == 12 and a.op("bwd/dense/interaction").args["launch"] == 21
    # their elementwise passes (x0 * (W x + b) + x) stream after the GEMMs
    assert op.args["fixed_hbm_bytes"] > 0
    assert a.op("bwd/dense/interaction").args["fixed_hbm_bytes"] == pytest.approx(2 * op.args["fixed_hbm_bytes"])


@pytest.mark.parametrize("name", ["fwd/p/hot_gather", "fwd/p/cold_gather", "fwd/p/pool", "opt/p/cold_update",
                                  "opt/p/hot_update"])
def test_gathers_pools_and_updates_move_random_rows(name):
    kw = {"hot_rows": {"C3": 5000}, "hot_ids_file": "x"}
    fast, slow = h200("perf.hbm_random=0.8"), h200("perf.hbm_random=0.2")
    lo_fast, lo_slow = lowered(hw=fast, **kw), lowered(hw=slow, **kw)
    op = lo_fast.op(name)
    assert op.demand["hbm_bytes"] > 0
    flow_fast, flow_slow = costs(lo_fast, fast)[name][1], costs(lo_slow, slow)[name][1]
    assert flow_fast == pytest.approx(op.demand["hbm_bytes"] / (4.8e12 * 0.8) * 1e6)
    assert flow_slow == pytest.approx(4 * flow_fast)  # a quarter of the random-row rate
    # the dense layers stream: the random-row rate leaves them alone
    assert costs(lo_slow, slow)["fwd/dense/top_mlp"] == pytest.approx(costs(lo_fast, fast)["fwd/dense/top_mlp"])


def test_the_embedding_backward_sorts_and_run_length_encodes_its_lookups():
    hw = h200("perf.parallel_units=1")
    lo = lowered(hw=hw)
    pv = lo.packs[0]
    m = get_model("dlrm-criteo-kaggle")
    lookups = BATCH * sum(t.pooling_factor for t in m.tables)
    assert pv.lookups == pytest.approx(lookups)
    op = lo.op("bwd/p/pool")
    # per lookup: 4 radix passes over (8-byte row id, 4-byte position), each read and
    # written (96 B), then run-length encoding reads the sorted ids and writes starts and
    # lengths (24 B)
    assert op.args["fixed_hbm_bytes"] == pytest.approx(lookups * 120)
    fixed, _ = costs(lo, hw)["bwd/p/pool"]
    want = 8 * hw.gpu.launch_us + stream_us(lookups * 120, hw) + stream_us(op.args["run_bytes"], hw)
    assert fixed == pytest.approx(want)
    # twice the batch: twice the lookups to sort
    assert lowered(hw=hw, batch=2 * BATCH).op("bwd/p/pool").args["fixed_hbm_bytes"] == pytest.approx(2 * lookups * 120)
    # the forward pool neither sorts nor sums runs
    assert "fixed_hbm_bytes" not in lo.op("fwd/p/pool").args and "run_bytes" not in lo.op("fwd/p/pool").args


def large_tables() -> ModelSpec:
    """The Kaggle model's tables of 50k rows (a table of a few rows has long runs whatever its skew)."""
    m = get_model("dlrm-criteo-kaggle").with_row_cap(50_000)
    return replace(m, tables=tuple(t for t in m.tables if t.num_rows >= 50_000))


def _access(m: ModelSpec, alpha: float):
    return {t.name: ZipfAccess(t.name, t.num_rows, t.pooling_factor, alpha) for t in m.tables}


def test_a_longer_run_of_one_row_costs_more():
    hw = h200()
    m = large_tables()
    assert len(m.tables) >= 4
    flat, skewed = _access(m, 0.3), _access(m, 1.4)
    lo_flat, lo_skew = lowered(m, hw=hw, access=flat), lowered(m, hw=hw, access=skewed)
    pv_flat, pv_skew = lo_flat.packs[0], lo_skew.packs[0]
    # the longest run: the lookups of the most frequent row of any table in the micro-batch
    assert pv_skew.longest_run == pytest.approx(max(BATCH * a.pooling * a.coverage_at(1) for a in skewed.values()))
    assert pv_skew.longest_run > 5 * pv_flat.longest_run
    a, b = lo_flat.op("bwd/p/pool"), lo_skew.op("bwd/p/pool")
    assert b.args["run_bytes"] == pytest.approx(pv_skew.longest_run * pv_skew.grad_row_bytes)
    assert a.args["fixed_hbm_bytes"] == pytest.approx(b.args["fixed_hbm_bytes"])  # same lookups to sort
    fa, fb = costs(lo_flat, hw)["bwd/p/pool"][0], costs(lo_skew, hw)["bwd/p/pool"][0]
    # one unit streams the run alone: at 1/parallel_units of the streaming rate
    extra = (b.args["run_bytes"] - a.args["run_bytes"]) * hw.perf.parallel_units
    assert fb - fa == pytest.approx(stream_us(extra, hw))
    assert fb > fa
    # fewer units sharing the memory: each streams a larger share, the run costs less
    few = h200("perf.parallel_units=4")
    assert costs(lowered(m, hw=few, access=skewed), few)["bwd/p/pool"][0] < fb


def test_a_cpu_spec_keeps_every_factor_at_one(monkeypatch):
    """On a CPU spec the rate classes the rules name (skinny GEMM, random rows) price nothing
    differently: every op's flow time is the one lowering gave before the rules."""
    for hw in (load_hardware("local-cpu", ["gpus_per_node=1"]),
               load_hardware("local-cpu", ["gpus_per_node=1", "efficiency.hbm=0.5", "efficiency.compute=0.25"])):
        assert hw.perf.empty
        assert hw.hbm_rate(kernel_passes.RANDOM_KEY) == hw.hbm_rate()
        assert hw.flops_rate("fp32", "gemm") == hw.flops_rate("fp32")
        for model in ("dlrm-criteo-kaggle", "dcn-v2"):
            m = get_model(model).with_row_cap(50_000)
            acc = table_access(m)
            kw = {"hot_rows": {m.table_names[0]: 100}, "hot_ids_file": "x"}
            with_rules = costs(lowered(model, hw=hw, access=acc, **kw), hw)
            with monkeypatch.context() as mp:
                mp.setattr(kernel_passes, "apply", lambda *a, **k: None)
                without = costs(lowered(model, hw=hw, access=acc, **kw), hw)
            assert with_rules.keys() == without.keys()
            for name in with_rules:
                assert with_rules[name][1] == pytest.approx(without[name][1], rel=1e-12), (model, name)
