"""Known answers for the cost model and both engines."""

import numpy as np
import pytest

from simulator import Collective, OpGraph, OpGraphError, op_cost_us, simulate
from simulator.cost import collective_cost
from simulator.synthetic import layered_graph
from tests.test_sim_helpers import toy_hw

ENGINES = ("fast", "simpy")


def ends(res):
    return {(e.rank, e.name): e.end_us for e in res.timeline.events}


@pytest.mark.parametrize("engine", ENGINES)
def test_single_op_is_its_roofline(engine):
    hw = toy_hw(launch_us=5.0)
    g = OpGraph(8)
    g.add_op("gemm", 0, "compute", flops=3e8, hbm_bytes=1e8)  # 300 us compute, 100 us memory
    g.add_op("gather", 1, "compute", flops=1e6, hbm_bytes=4e8)  # 1 us compute, 400 us memory
    g.add_op("h2d", 2, "copy", pcie_bytes=1e6)  # 100 us
    g.add_op("half", 3, "compute", flops=4e8, dtype="fp16")  # fp16 is 4x faster: 100 us
    res = simulate(g, hw, engine)
    e = ends(res)
    assert e[(0, "gemm")] == pytest.approx(305.0)
    assert e[(1, "gather")] == pytest.approx(405.0)
    assert e[(2, "h2d")] == pytest.approx(105.0)
    assert e[(3, "half")] == pytest.approx(105.0)
    assert res.iteration_us == pytest.approx(405.0)
    assert op_cost_us(g.op("0:gemm"), hw) == pytest.approx(305.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_ops_on_different_resources_overlap(engine):
    g = OpGraph(8)
    g.add_op("gemm", 0, "compute", flops=1e8)  # compute, 100 us
    g.add_op("copy", 0, "copy", pcie_bytes=8e5)  # pcie, 80 us
    res = simulate(g, toy_hw(), engine)
    assert res.iteration_us == pytest.approx(100.0)
    assert ends(res)[(0, "copy")] == pytest.approx(80.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_two_flows_on_one_link_take_twice_as_long(engine):
    g = OpGraph(8)
    g.add_op("copy_a", 0, "copy_a", pcie_bytes=1e6)  # 100 us alone
    g.add_op("copy_b", 0, "copy_b", pcie_bytes=1e6)
    res = simulate(g, toy_hw(), engine)
    assert res.iteration_us == pytest.approx(200.0)
    assert res.utilisation["pcie"] == pytest.approx(1.0)
    if engine == "simpy":  # fair sharing, not first come first served: both end together
        assert ends(res)[(0, "copy_a")] == pytest.approx(200.0)
        assert ends(res)[(0, "copy_b")] == pytest.approx(200.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_overlap_helps_only_on_different_resources(engine):
    """Kernel interleaving: a gather (HBM) overlaps a shuffle (NVLink), not another gather."""
    hw = toy_hw()

    def graph(second_is_gather):
        g = OpGraph(8)
        for r in range(8):
            g.add_op("gather0", r, "compute", hbm_bytes=1e8)  # 100 us
            if second_is_gather:
                g.add_op("gather1", r, "compute2", hbm_bytes=1e8)
            else:  # all-to-all of 8/7 * 1e7 bytes: 7/8 of it over NVLink at 1e5 B/us = 100 us (+2 us)
                g.add_op("a2a", r, "comm", collective=Collective("all_to_all", tuple(range(8)), 8e7 / 7))
        return g

    assert simulate(graph(False), hw, engine).iteration_us == pytest.approx(102.0)
    assert simulate(graph(True), hw, engine).iteration_us == pytest.approx(200.0)


def test_partial_overlap_fair_share_simpy():
    """A starts at 0 (100 us alone), B starts at 50 (100 us alone) on the same link:
    A runs alone 50 us, both at half rate until A ends at 150, B alone until 200."""
    g = OpGraph(1)
    g.add_op("wait", 0, "copy_b", fixed_us=50.0)
    g.add_op("a", 0, "copy_a", pcie_bytes=1e6)
    g.add_op("b", 0, "copy_b", pcie_bytes=1e6)
    res = simulate(g, toy_hw(gpus_per_node=1), "simpy")
    e = ends(res)
    assert e[(0, "a")] == pytest.approx(150.0)
    assert e[(0, "b")] == pytest.approx(200.0)
    assert simulate(g, toy_hw(gpus_per_node=1), "fast").iteration_us == pytest.approx(200.0)


def test_collective_closed_forms():
    n = 8e6
    one_node, two_nodes = toy_hw(), toy_hw(nodes=2, gpus_per_node=4)
    g8 = tuple(range(8))

    def cost(kind, hw, algo=None):
        lat, bw, _ = collective_cost(Collective(kind, g8, n, algo), hw)
        return lat + bw

    # ring all-reduce: 2(p-1) a + 2 (p-1)/p n / B
    assert cost("all_reduce", one_node) == pytest.approx(2 * 7 * 2.0 + 2 * 7 / 8 * n / 1e5)
    assert cost("all_reduce", two_nodes, "ring") == pytest.approx(2 * 7 * 5.0 + 2 * 7 / 8 * n / 1e4)
    assert cost("all_reduce", one_node, "tree") == pytest.approx(2 * 3 * 2.0 + 2 * n / 1e5)
    # hierarchical: intra reduce-scatter + inter all-reduce of n/g over m nodes + intra all-gather
    assert cost("all_reduce", two_nodes) == pytest.approx(
        2 * 3 * 2.0 + 2 * 1 * 5.0 + 2 * 3 / 4 * n / 1e5 + 2 * 1 / 2 * (n / 4) / 1e4)
    # across many nodes a small sum goes by a tree (2 log2 m latency steps), a large one by a ring
    many = toy_hw(nodes=16, gpus_per_node=4)
    g64 = tuple(range(64))
    small, large = 4e3, 4e9
    lat, bw, _ = collective_cost(Collective("all_reduce", g64, small), many)
    assert lat == pytest.approx(2 * 3 * 2.0 + 2 * 4 * 5.0)
    assert bw == pytest.approx(2 * 3 / 4 * small / 1e5 + 2 * (small / 4) / 1e4)
    lat, bw, _ = collective_cost(Collective("all_reduce", g64, large), many)
    assert lat == pytest.approx(2 * 3 * 2.0 + 2 * 15 * 5.0)
    assert bw == pytest.approx(2 * 3 / 4 * large / 1e5 + 2 * 15 / 16 * (large / 4) / 1e4)
    # all-to-all: a + max(intra part, inter part)
    assert cost("all_to_all", one_node) == pytest.approx(2.0 + 7 / 8 * n / 1e5)
    assert cost("all_to_all", two_nodes) == pytest.approx(5.0 + max(3 / 8 * n / 1e5, 4 / 8 * n / 1e4))
    assert cost("all_gather", one_node) == pytest.approx(7 * 2.0 + 7 * n / 1e5)
    assert cost("reduce_scatter", one_node) == pytest.approx(7 * 2.0 + 7 / 8 * n / 1e5)
    assert cost("broadcast", one_node) == pytest.approx(3 * 2.0 + n / 1e5)
    # a single-rank collective is free
    assert collective_cost(Collective("all_reduce", (0,), n), one_node)[:2] == (0.0, 0.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_ring_allreduce_and_all_to_all_in_the_engines(engine):
    n, hw = 8e6, toy_hw()
    g = OpGraph(8)
    for r in range(8):
        a = g.add_op("ar", r, "comm", collective=Collective("all_reduce", tuple(range(8)), n, "ring"))
        g.add_op("a2a", r, "comm", collective=Collective("all_to_all", tuple(range(8)), n), deps=[a])
    res = simulate(g, hw, engine)
    t_ar = 2 * 7 * 2.0 + 2 * 7 / 8 * n / 1e5
    t_a2a = 2.0 + 7 / 8 * n / 1e5
    assert ends(res)[(5, "ar")] == pytest.approx(t_ar)
    assert res.iteration_us == pytest.approx(t_ar + t_a2a)


@pytest.mark.parametrize("engine", ENGINES)
def test_collective_waits_for_slowest_rank(engine):
    g = OpGraph(2)
    for r in range(2):
        w = g.add_op("work", r, "compute", flops=1e6 * (10 if r == 0 else 50))
        g.add_op("ar", r, "comm", collective=Collective("all_reduce", (0, 1), 1e5, "ring"), deps=[w])
    res = simulate(g, toy_hw(gpus_per_node=2), engine)
    ev = {(e.rank, e.name): e for e in res.timeline.events}
    assert ev[(0, "ar")].start_us == pytest.approx(50.0) == ev[(1, "ar")].start_us
    assert res.iteration_us == pytest.approx(50.0 + 2 * 2.0 + 1e5 / 1e5)


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("k,m", [(4, 6), (3, 1), (2, 5)])
def test_k_stage_pipeline_makespan(engine, k, m):
    """Stage s of micro-batch b on rank s after stage s-1: makespan (m + k - 1) t."""
    t = 10.0
    g = OpGraph(k)
    for b in range(m):
        prev = None
        for s in range(k):
            prev = g.add_op(f"s{s}@mb{b}", s, "compute", flops=t * 1e6, deps=[prev] if prev else [])
    res = simulate(g, toy_hw(gpus_per_node=k), engine)
    assert res.iteration_us == pytest.approx((m + k - 1) * t)
    assert len(res.critical_path) == m + k - 1


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("nic_per", ["gpu", "node"])
def test_symmetric_equals_full(engine, nic_per):
    hw = toy_hw(nodes=2, gpus_per_node=8, nic_per=nic_per)
    kw = dict(layers=3, micro_batches=2, flops=5e7, hbm_bytes=2e7, a2a_bytes=4e6, pcie_bytes=3e5)
    full = simulate(layered_graph(16, **kw), hw, engine)
    sym = simulate(layered_graph(16, symmetric=True, **kw), hw, engine)
    assert sym.iteration_us == pytest.approx(full.iteration_us, rel=1e-9)
    assert len(sym.timeline.events) * 16 == len(full.timeline.events)
    assert sym.peak_mem[0] == pytest.approx(full.peak_mem[0])
    for k in ("compute", "hbm", "intra", "nic", "pcie"):
        assert sym.utilisation[k] == pytest.approx(full.utilisation[k], rel=1e-9)


def test_symmetric_1024_costs_like_8():
    kw = dict(layers=4, micro_batches=3)
    small = layered_graph(8, symmetric=True, **kw)
    big = layered_graph(1024, symmetric=True, **kw)
    assert len(small) == len(big)
    t8 = simulate(small, toy_hw(nodes=1), "simpy").iteration_us
    t1024 = simulate(big, toy_hw(nodes=128), "simpy").iteration_us
    assert t1024 > t8  # inter-node all-to-all and all-reduce are slower
    assert t1024 == pytest.approx(simulate(big, toy_hw(nodes=128), "fast").iteration_us, rel=0.05)


def _random_graph(seed, ranks=4, ops_per_rank=40):
    rng = np.random.default_rng(seed)
    g = OpGraph(ranks)
    lanes = ["compute", "copy", "comm", "host"]
    ids = {r: [] for r in range(ranks)}
    n_coll = 0
    for i in range(ops_per_rank):
        if i % 7 == 3:  # a collective on every rank, after a random earlier op of each
            kind = ["all_reduce", "all_to_all", "all_gather"][n_coll % 3]
            c = Collective(kind, tuple(range(ranks)), float(rng.uniform(1e5, 1e7)))
            for r in range(ranks):
                deps = [ids[r][int(rng.integers(len(ids[r])))]] if ids[r] else []
                ids[r].append(g.add_op(f"c{n_coll}", r, "comm", collective=c, deps=deps))
            n_coll += 1
            continue
        for r in range(ranks):
            lane = lanes[int(rng.integers(0, 4))]
            if lane == "comm":
                lane = "compute"
            demand = {"compute": {"flops": rng.uniform(1e6, 1e8)}, "copy": {"pcie_bytes": rng.uniform(1e4, 1e6)},
                      "host": {"host_bytes": rng.uniform(1e4, 1e6), "pcie_bytes": rng.uniform(1e4, 1e6)}}[lane]
            if rng.random() < 0.5:
                demand["hbm_bytes"] = rng.uniform(1e6, 1e8)
            deps = [ids[r][int(rng.integers(len(ids[r])))]] if ids[r] and rng.random() < 0.6 else []
            ids[r].append(g.add_op(f"o{i}", r, lane, **demand, deps=deps))
    return g


@pytest.mark.parametrize("seed", range(10))
def test_fast_agrees_with_simpy_on_random_graphs(seed):
    g = _random_graph(seed, ops_per_rank=60)
    hw = toy_hw(nodes=2, gpus_per_node=2, launch_us=3.0)
    a, b = simulate(g, hw, "fast").iteration_us, simulate(g, hw, "simpy").iteration_us
    assert a == pytest.approx(b, rel=0.05)


@pytest.mark.parametrize("interleave", [False, True])
@pytest.mark.parametrize("world,nodes", [(8, 1), (16, 2)])
def test_fast_agrees_with_simpy_on_layered_graphs(world, nodes, interleave):
    g = layered_graph(world, layers=5, micro_batches=3, flops=2e7, hbm_bytes=4e7, a2a_bytes=2e6, pcie_bytes=5e5,
                      interleave=interleave)
    hw = toy_hw(nodes=nodes, gpus_per_node=world // nodes, launch_us=4.0)
    a, b = simulate(g, hw, "fast").iteration_us, simulate(g, hw, "simpy").iteration_us
    assert a == pytest.approx(b, rel=0.05)


@pytest.mark.parametrize("engine", ENGINES)
def test_peak_memory_from_alloc_and_free(engine):
    g = OpGraph(1)
    a = g.add_op("a", 0, "compute", flops=1e7, mem_alloc=100)
    b = g.add_op("b", 0, "compute", flops=1e7, mem_alloc=50, mem_free=100, deps=[a])
    g.add_op("c", 0, "compute", flops=1e7, mem_alloc=30, mem_free=80, deps=[b])
    res = simulate(g, toy_hw(gpus_per_node=1), engine)
    assert res.peak_mem == {0: 150.0}  # b frees a's 100 at its end, before c allocates 30


@pytest.mark.parametrize("engine", ENGINES)
def test_critical_path_follows_the_long_branch(engine):
    g = OpGraph(1)
    a = g.add_op("a", 0, "compute", flops=1e7)
    b_long = g.add_op("long", 0, "copy", pcie_bytes=1e6, deps=[a])  # 100 us
    b_short = g.add_op("short", 0, "compute", flops=1e6, deps=[a])  # 1 us
    g.add_op("end", 0, "compute", flops=1e6, deps=[b_long, b_short])
    res = simulate(g, toy_hw(gpus_per_node=1), engine)
    assert res.critical_path == ["0:a", "0:long", "0:end"]
    s = res.summary()
    assert s["iteration_us"] == pytest.approx(111.0) and s["critical_path"] == res.critical_path


def test_efficiency_factors():
    g = OpGraph(8)
    g.add_op("gather", 0, "compute", hbm_bytes=1e8, eff_key="gather")
    g.add_op("plain", 1, "compute", hbm_bytes=1e8)
    for r in range(8):
        g.add_op("ar", r, "comm", collective=Collective("all_reduce", tuple(range(8)), 8e6, "ring"))
    hw = toy_hw(efficiency={"gather": 0.5, "all_reduce": 0.5})
    e = ends(simulate(g, hw, "fast"))
    assert e[(0, "gather")] == pytest.approx(200.0) and e[(1, "plain")] == pytest.approx(100.0)
    assert e[(3, "ar")] == pytest.approx(2 * 7 * 2.0 + 2 * (2 * 7 / 8 * 8e6 / 1e5))


def test_cpu_kind_uses_same_path():
    from simulator import load_hardware

    hw = load_hardware("local-cpu")
    g = OpGraph(2)
    for r in range(2):
        g.add_op("ar", r, "comm", collective=Collective("all_reduce", (0, 1), 1e6, "ring"))
    expected = 2 * 1 * hw.intra_latency_us + 2 * 1 / 2 * 1e6 / hw.nvlink_bw * 1e6 + hw.gpu.launch_us
    assert simulate(g, hw, "simpy").iteration_us == pytest.approx(expected)


@pytest.mark.parametrize("engine", ENGINES)
def test_cycle_gives_clear_error(engine):
    g = OpGraph(1)
    a = g.add_op("a", 0, "compute", flops=1)
    b = g.add_op("b", 0, "copy", flops=1, deps=[a])
    g.add_dep(b, a)
    with pytest.raises(OpGraphError, match=r"dependency cycle: 0:(a|b) -> 0:(a|b) -> 0:(a|b)"):
        simulate(g, toy_hw(gpus_per_node=1), engine)
    with pytest.raises(OpGraphError, match="cycle"):
        g.validate()


@pytest.mark.parametrize("engine", ENGINES)
def test_collective_order_deadlock_is_reported(engine):
    g = OpGraph(2)
    x, y = Collective("all_reduce", (0, 1), 1e3), Collective("all_gather", (0, 1), 1e3)
    g.add_op("x", 0, "comm", collective=x)
    g.add_op("y", 0, "comm", collective=y)
    g.add_op("y", 1, "comm", collective=y)
    g.add_op("x", 1, "comm", collective=x)
    with pytest.raises(OpGraphError, match="wait forever"):
        simulate(g, toy_hw(gpus_per_node=2), engine)


@pytest.mark.parametrize("engine", ENGINES)
def test_fold_identical_ranks_keeps_skewed_ones(engine):
    from simulator.symmetry import fold_symmetric

    g = OpGraph(16)
    everyone = Collective("all_to_all", tuple(range(16)), 4e6)
    for r in range(16):
        skew = 3.0 if r == 5 else 1.0  # rank 5 holds a hot shard: three times the gather
        a = g.add_op("gather", r, "compute", hbm_bytes=1e7 * skew)
        b = g.add_op("a2a", r, "comm", collective=everyone, deps=[a])
        g.add_op("mlp", r, "compute", flops=5e7, deps=[b])
    folded = fold_symmetric(g)
    assert folded.symmetric and folded.rank_weights == {0: 15, 5: 1} and len(folded) == 6
    hw = toy_hw(nodes=2, gpus_per_node=8)
    full, sym = simulate(g, hw, engine), simulate(folded, hw, engine)
    assert sym.iteration_us == pytest.approx(full.iteration_us, rel=1e-9)
    assert full.iteration_us == pytest.approx(30.0 + 5.0 + max(7 / 16 * 4e6 / 1e5, 8 / 16 * 4e6 / 1e4) + 50.0)
    assert sym.utilisation["hbm"] == pytest.approx(full.utilisation["hbm"])
    assert fold_symmetric(folded) is folded


def test_cpu_memory_traffic_shares_dram():
    from simulator import load_hardware

    hw = load_hardware("local-cpu", {"gpu.launch_us": 0})
    g = OpGraph(2)
    g.add_op("gather", 0, "compute", hbm_bytes=8e6, host_bytes=8e6)
    per_worker_dram = hw.host.dram_bw / hw.gpus_per_node
    expected = (8e6 / hw.gpu.hbm_bw + 8e6 / per_worker_dram) * 1e6  # one DRAM, one after the other
    assert op_cost_us(g.op("0:gather"), hw) == pytest.approx(expected)
    assert simulate(g, hw, "simpy").iteration_us == pytest.approx(expected)
    assert simulate(g, hw, "fast").iteration_us == pytest.approx(expected)


def test_fast_skips_only_resources_that_one_lane_uses():
    """hbm is used by two lanes (shared: kept); pcie and compute by one lane each (never shared: left
    out of the fast engine's bookkeeping). Results stay those of the full model."""
    from simulator.compiled import costs, structure
    from simulator.cost import RESOURCES
    from simulator.fast import _unit_resources

    g = OpGraph(1)
    g.add_op("gather", 0, "memory", hbm_bytes=1e8)
    g.add_op("mlp", 0, "compute", flops=1e8, hbm_bytes=5e7)
    g.add_op("mlp2", 0, "compute", flops=1e8)
    g.add_op("h2d", 0, "copy", pcie_bytes=1e6)
    hw = toy_hw(gpus_per_node=1)
    st = structure(g)
    ur, ub, ur2, ub2, multi = _unit_resources(st, costs(st, hw))
    kept = {RESOURCES[r] for r in ur + ur2 if r >= 0}
    assert kept == {"hbm"} and not multi
    # gather and mlp share hbm (100 + 50 us of work): the fast engine still sees it
    for engine in ENGINES:
        ends_ = ends(simulate(g, hw, engine))
        assert ends_[(0, "gather")] == pytest.approx(150.0)
        assert ends_[(0, "mlp2")] >= ends_[(0, "mlp")] + 100.0 - 1e-9  # lane order on the unshared compute
        assert ends_[(0, "h2d")] == pytest.approx(100.0)
