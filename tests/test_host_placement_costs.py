"""Host placement costed as the executor runs it (the CPU goal: a host-placed plan within
15% of its calibrated prediction, bench/bench_host_placement.py).

- On a CPU worker host memory is the worker's own DRAM: a host gather costs what the same
  gather in "device" memory costs (the calibrated rate), and no PCIe copy exists.
- A host-placed pack's update runs in host memory; only its gradients and IDs cross PCIe.
- An op of a class no fit plan ran still pays the measured host time between two ops.
- On one rank, hot rows never leave the device's cache: the host gathers only the cold rows.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from simulator.cost import op_cost_us
from simulator.hardware import load_hardware


def cpu_spec(hbm_eff: float = 0.3):
    hw = load_hardware("local-cpu", ["gpus_per_node=2"])
    d = hw.to_dict()
    d["efficiency"] = {"hbm": hbm_eff}
    from simulator.hardware import HardwareSpec

    return HardwareSpec.from_dict(d, where="test")


def test_cpu_worker_host_bytes_cost_as_its_memory_and_copies_cost_nothing():
    hw = cpu_spec()
    n = 64e6
    launch = op_cost_us({"kind": "compute"}, hw)
    assert op_cost_us({"kind": "compute", "host_bytes": n}, hw) == pytest.approx(
        op_cost_us({"kind": "compute", "hbm_bytes": n}, hw))
    assert op_cost_us({"kind": "copy", "pcie_bytes": n}, hw) == pytest.approx(launch)
    # the simulator's compiled path agrees with the per-op cost
    from simulator.engine import simulate
    from simulator.opgraph import OpGraph

    g = OpGraph(1)
    a = g.add_op("gather_host", 0, "compute", kind="compute", host_bytes=n)
    b = g.add_op("gather_dev", 0, "compute", kind="compute", hbm_bytes=n, deps=(a,))
    g.add_op("copy", 0, "copy", kind="copy", pcie_bytes=n, deps=(b,))
    one = load_hardware("local-cpu", ["gpus_per_node=1"]).to_dict()
    one["efficiency"] = {"hbm": 0.3}
    from simulator.hardware import HardwareSpec

    res = simulate(g, HardwareSpec.from_dict(one, where="test"), engine="fast")
    dur = dict(zip([g.g.nodes[i]["name"] for i in res.st.ids], (res.end_us - res.start_us).tolist()))
    assert dur["gather_host"] == pytest.approx(dur["gather_dev"])
    assert dur["copy"] == pytest.approx(hw.gpu.launch_us)
    # a GPU machine still has a bus and a host memory of its own
    hw = load_hardware("dgx-h100")
    assert op_cost_us({"kind": "copy", "pcie_bytes": n}, hw) > op_cost_us({"kind": "copy"}, hw) + n / hw.pcie_bw * 1e6 * 0.99
    assert op_cost_us({"kind": "compute", "host_bytes": n}, hw) != pytest.approx(
        op_cost_us({"kind": "compute", "hbm_bytes": n}, hw))


def _tiny_plan(world: int, placement: str):
    from planner.model_spec import ModelSpec, TableSpec
    from planner.plan import OptimizerPlan, PackPlan, Plan

    tables = (TableSpec("big", 5000, 16), TableSpec("small", 300, 16))
    m = ModelSpec("t", "dlrm", 13, tables, bottom_mlp=(16, 16), top_mlp=(16, 1))
    return Plan(m, world, 64, [PackPlan("pack0", ["big", "small"], "row_wise", placement=placement)],
                hot_rows={"big": 50}, hot_ids_file="hot.npz", optimizer=OptimizerPlan("sgd", 0.1, "sgd", 0.1))


def test_host_placed_update_runs_in_host_memory_and_moves_only_gradients(monkeypatch):
    """Staged access (planner.host_access; the GPU falls back to it where it cannot map host memory)."""
    from planner import lowering
    from planner.host_access import HostAccess
    from planner.lowering import lower
    from planner.volumes import GRAD_BYTES, ID_BYTES

    monkeypatch.setattr(lowering, "host_access", lambda kind: HostAccess.STAGED)
    hw = load_hardware("dgx-h100", ["gpus_per_node=2"])
    dev = lower(_tiny_plan(2, "hbm"), hw).graph
    host = lower(_tiny_plan(2, "host"), hw).graph
    name = "opt/pack0/cold_update"
    d = next(a for _, a in dev.ops() if a["name"] == name and a["rank"] == 0)
    h = next(a for _, a in host.ops() if a["name"] == name and a["rank"] == 0)
    assert h["hbm_bytes"] == 0 and h["host_bytes"] == pytest.approx(d["hbm_bytes"])
    # rows updated: the same bytes per row as on the device; PCIe: each row's fp32 gradient and ID
    rows = d["flops"] / (16 * 3)
    assert h["pcie_bytes"] == pytest.approx(rows * (16 * GRAD_BYTES + ID_BYTES))


def test_an_unfitted_op_class_still_pays_the_host_gap():
    from planner.lowering import lower
    from simulator.compiled import op_costs

    hw = load_hardware("local-cpu", ["gpus_per_node=1"])
    d = hw.to_dict()
    d["efficiency"] = {"opgap": 2.0, "opfixed:fwd/pack/cold_gather": 3.0}  # an old file's keys
    from simulator.hardware import HardwareSpec

    spec = HardwareSpec.from_dict(d, where="test")
    graph = lower(_tiny_plan(1, "host"), spec).graph
    fixed = {k.partition(":")[2]: f for k, (f, _) in op_costs(graph, spec).items()}
    launch = spec.gpu.launch_us
    assert fixed["fwd/pack0/cold_gather"] == pytest.approx((3.0 + 2.0) * launch)
    assert fixed["fwd/pack0/cold_h2d"] == pytest.approx((1.0 + 2.0) * launch)  # no fit plan ran a host copy


def test_one_rank_host_gather_reads_only_cold_rows():
    """The hot rows of a lookup stay in the device's cache: the host gathers the cold ones
    only (before, every unique row, hot ones too, crossed from host memory)."""
    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.trainer import Trainer
    from planner.plan import Plan

    plan = Plan.from_dict(_tiny_plan(1, "host").to_dict())
    hot = {"big": np.arange(50, dtype=np.int64)}  # the hottest rows of a Zipf-like draw
    tr = Trainer(plan, hot, Comm())
    gathered: list[int] = []
    staged_rows: list[torch.Tensor] = []
    orig = torch.index_select

    def spy(t, dim, index, **kw):
        if t is tr.packs[0].weight:
            gathered.append(len(index))
            staged_rows.append(index.clone())
        return orig(t, dim, index, **kw)

    batch = local_rows(synthetic_global_batches(plan, 1, seed=3)[0], plan, 0)
    torch.index_select = spy  # the host gather's index_select (executor.sparse.embedding calls torch's)
    try:
        tr.step(batch)
    finally:
        torch.index_select = orig
    p = tr.packs[0]
    ids = torch.cat([batch.sparse["big"][0], batch.sparse["small"][0] + 5000]).unique()
    hot_ids = set(p.hot_packed.tolist())
    cold = [i for i in ids.tolist() if i not in hot_ids]
    assert len(hot_ids & set(ids.tolist())) > 0  # the batch touches hot rows
    assert gathered == [len(cold)]
    assert sorted(staged_rows[0].tolist()) == sorted(cold)
