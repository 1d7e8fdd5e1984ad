"""Host-placed packs reached as the rank's device allows (planner.host_access): a GPU maps the
shard and its kernels read and update rows in place over PCIe (one op each way, no staging, the
step still one CUDA graph); a CPU worker gathers rows in its own memory. Lowering costs what
the executor runs, and the host shard is held once, pinned where it lies."""

from __future__ import annotations

import pytest
import torch

from planner.host_access import HostAccess, host_access
from simulator.hardware import load_hardware


def _plan(world: int, placement: str = "host"):
    from planner.model_spec import ModelSpec, TableSpec
    from planner.plan import OptimizerPlan, PackPlan, Plan

    tables = (TableSpec("big", 5000, 16), TableSpec("small", 300, 16))
    m = ModelSpec("t", "dlrm", 13, tables, bottom_mlp=(16, 16), top_mlp=(16, 1))
    return Plan(m, world, 64, [PackPlan("pack0", ["big", "small"], "row_wise", placement=placement)],
                hot_rows={"big": 50}, hot_ids_file="hot.npz",
                optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "sgd", 0.1))


def _ops(graph, rank: int = 0) -> dict[str, dict]:
    return {a["name"]: a for _, a in graph.ops() if a["rank"] == rank}


def test_the_rule_by_device_kind():
    assert host_access("gpu") == host_access("cuda") == HostAccess.MAPPED
    assert host_access("cpu") == HostAccess.STAGED
    assert HostAccess.from_str("mapped") == HostAccess.MAPPED


def test_gpu_lowering_reads_and_updates_host_rows_in_place_over_pcie():
    from planner.lowering import lower

    hw = load_hardware("dgx-h100", ["gpus_per_node=2"])
    host = _ops(lower(_plan(2), hw).graph)
    dev = _ops(lower(_plan(2, "hbm"), hw).graph)
    assert "fwd/pack0/cold_h2d" not in host  # no staging copy: the kernel reads over the bus
    g, dg = host["fwd/pack0/cold_gather"], dev["fwd/pack0/cold_gather"]
    rows_bytes = dg["hbm_bytes"] - g["hbm_bytes"]  # the rows' bytes left HBM for PCIe
    assert g["pcie_bytes"] == pytest.approx(rows_bytes) and g["pcie_bytes"] > 0 and g["host_bytes"] == 0
    u, du = host["opt/pack0/cold_update"], dev["opt/pack0/cold_update"]
    # every byte the update touches (rows and their row-wise state, read and written) crosses PCIe
    assert u["host_bytes"] == 0 and u["hbm_bytes"] == 0 and u["pcie_bytes"] == pytest.approx(du["hbm_bytes"])


def test_cpu_lowering_keeps_the_staged_gather_and_copy():
    from planner.lowering import lower

    hw = load_hardware("local-cpu", ["gpus_per_node=2"])
    ops = _ops(lower(_plan(2), hw).graph)
    assert {"fwd/pack0/cold_gather", "fwd/pack0/cold_h2d"} <= set(ops)
    assert ops["fwd/pack0/cold_gather"]["host_bytes"] > 0


def test_explain_says_what_the_device_cache_saves():
    from planner.explain import _host_cache_lines

    packs = [{"pack": "pack0", "placement": "host", "host_access": "mapped", "hot_rows": 79_720,
              "hot_coverage": 0.978, "host_cache_saves_bytes": 51.1e6},
             {"pack": "pack1", "placement": "hbm"}]
    hw = load_hardware("h200")
    (line,) = _host_cache_lines(packs, hw)
    assert line.startswith("pack0 lives in host memory, its rows read and updated in place over PCIe")
    assert "79,720 hot rows" in line and "97.8%" in line and "51.1 MB of PCIe reads" in line


def test_cpu_rank_holds_the_host_shard_without_a_copy():
    from executor.sparse.host_memory import host_tensor

    t = torch.randn(100, 8)
    out = host_tensor(t, torch.device("cpu"), HostAccess.STAGED)
    assert out.data_ptr() == t.data_ptr()


def test_owned_copies_only_what_cannot_be_registered():
    from executor.sparse.host_memory import _owned

    t = torch.randn(10, 4)
    assert _owned(t).data_ptr() == t.data_ptr()
    part = t[2:5]  # a view into a larger storage: registering it would pin its neighbours
    assert _owned(part).data_ptr() != part.data_ptr() and torch.equal(_owned(part), part)
    assert _owned(t.t()).is_contiguous()


def test_graph_refusal_follows_the_access(monkeypatch):
    from executor.run import cuda_graph
    from executor.sparse import host_memory
    from planner.plan import Plan

    plan = Plan.from_dict(_plan(1).to_dict())
    cuda = torch.device("cuda")
    monkeypatch.setattr(host_memory, "access_on", lambda device: HostAccess.MAPPED)
    assert cuda_graph.refusal(plan, cuda) is None
    monkeypatch.setattr(host_memory, "access_on", lambda device: HostAccess.STAGED)
    assert "cannot map" in cuda_graph.refusal(plan, cuda)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_mapped_rows_are_host_memory_read_and_written_by_the_gpu():
    from executor.sparse.host_memory import mapped

    host = torch.randn(1000, 16)
    view = mapped(host, torch.device("cuda"))
    assert view.is_cuda and view.data_ptr() == host.data_ptr()  # _owned kept the pages: no copy
    rows = torch.tensor([3, 999, 0], device="cuda")
    assert torch.equal(view.index_select(0, rows).cpu(), host[[3, 999, 0]])
    view.index_add_(0, rows, torch.ones(3, 16, device="cuda"))
    torch.cuda.synchronize()
    assert torch.equal(host[999], view[999].cpu())  # the kernel wrote host memory in place
    bf = mapped(torch.randn(10, 4).to(torch.bfloat16), torch.device("cuda"))
    assert bf.dtype == torch.bfloat16 and bf.is_cuda
