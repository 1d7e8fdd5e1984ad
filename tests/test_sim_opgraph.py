import json

import pytest

from simulator import Collective, OpGraph, OpGraphError, simulate
from simulator.synthetic import layered_graph
from tests.test_sim_helpers import toy_hw


def test_add_op_ids_and_attributes():
    g = OpGraph(4)
    a = g.add_op("fwd/pack0/gather", 1, "compute", "memory", hbm_bytes=10.0, eff_key="gather")
    assert a == "1:fwd/pack0/gather" and a in g and len(g) == 1
    attrs = g.op(a)
    assert attrs["rank"] == 1 and attrs["lane"] == "compute" and attrs["args"] == {"eff_key": "gather"}
    assert [nid for nid, _ in g.ops()] == [a]
    c = g.add_op("x", 2, "comm", collective=Collective("all_reduce", (2, 3), 4.0), deps=[a])
    assert g.op(c)["kind"] == "collective" and list(g.g.predecessors(c)) == [a]
    assert g.ranks() == [1, 2] and g.rank_weights == {1: 1, 2: 1}


@pytest.mark.parametrize("call,needle", [
    (lambda g: g.add_op("a", 9, "compute"), "rank 9 outside"),
    (lambda g: g.add_op("a", 0, "compute", flops=-1), "flops = -1"),
    (lambda g: g.add_op("a", 0, "compute", deps=["0:nope"]), "unknown op '0:nope'"),
    (lambda g: g.add_op("a", 0, "comm", collective=Collective("all_reduce", (1, 2), 1.0)), "not in its collective"),
    (lambda g: Collective("all_shuffle", (0, 1), 1.0), "collective type"),
    (lambda g: Collective("all_reduce", (0, 0), 1.0), "distinct ranks"),
    (lambda g: Collective("all_reduce", (0, 1), 1.0, "magic"), "algorithm"),
])
def test_bad_ops_one_clear_line(call, needle):
    g = OpGraph(4)
    with pytest.raises(OpGraphError, match=needle):
        call(g)


def test_duplicate_op_and_world_size():
    g = OpGraph(2)
    g.add_op("a", 0, "compute")
    with pytest.raises(OpGraphError, match="added twice"):
        g.add_op("a", 0, "compute")
    with pytest.raises(OpGraphError, match="world_size"):
        OpGraph(0)
    with pytest.raises(OpGraphError, match="rank_weights"):
        OpGraph(4, symmetric=True, rank_weights={0: 5})


def test_missing_collective_member_is_an_error():
    g = OpGraph(3)
    c = Collective("all_to_all", (0, 1, 2), 1e3)
    g.add_op("a2a", 0, "comm", collective=c)
    g.add_op("a2a", 1, "comm", collective=c)
    g.add_op("work", 2, "compute", flops=1.0)
    with pytest.raises(OpGraphError, match="rank 2 of its group has no op 'a2a'"):
        simulate(g, toy_hw(gpus_per_node=3), "fast")
    with pytest.raises(OpGraphError, match="rank 2 has no op"):
        g.validate()


def test_json_round_trip(tmp_path):
    g = layered_graph(4, layers=2, micro_batches=2)
    g.meta["plan"] = "p"
    p = tmp_path / "g.json"
    g.save(p)
    h = OpGraph.load(p)
    assert len(h) == len(g) and set(h.g.edges()) == set(g.g.edges()) and h.meta == {"plan": "p"}
    assert h.op("0:mb1/l1/gather") == g.op("0:mb1/l1/gather")
    hw = toy_hw(gpus_per_node=4)
    assert simulate(h, hw).iteration_us == simulate(g, hw).iteration_us
    sym = layered_graph(64, symmetric=True)
    sym.save(p)
    again = OpGraph.load(p)
    assert again.symmetric and again.rank_weights == {0: 64}


def test_bad_json(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text("{not json")
    with pytest.raises(OpGraphError, match="not valid JSON"):
        OpGraph.load(p)
    p.write_text(json.dumps({"world_size": 2, "ops": [{"rank": 0}]}))
    with pytest.raises(OpGraphError, match=r"ops\[0\]: malformed op"):
        OpGraph.load(p)


def test_symmetric_default_weights():
    g = OpGraph(16, symmetric=True)
    g.add_op("a", 0, "compute")
    g.add_op("a", 8, "compute")
    assert g.rank_weights == {0: 8, 8: 8}


def test_in_place_edits_are_seen_after_refresh():
    g = OpGraph(1)
    g.add_op("gather", 0, "compute", hbm_bytes=1e8)
    hw = toy_hw(gpus_per_node=1, efficiency={"gather": 0.5})
    assert simulate(g, hw).iteration_us == pytest.approx(100.0)
    g.op("0:gather")["args"]["eff_key"] = "gather"
    g.op("0:gather")["args"]["fixed_us"] = 7.0
    g.refresh()
    assert simulate(g, hw).iteration_us == pytest.approx(207.0)


def test_compiled_form_is_cached_and_invalidated_on_every_change():
    from simulator.compiled import structure

    hw = toy_hw(gpus_per_node=1)
    g = OpGraph(1)
    g.add_op("a", 0, "compute", flops=1e8)  # 100 us
    assert simulate(g, hw).iteration_us == pytest.approx(100.0)
    st = structure(g)
    assert structure(g) is st  # cached: a second run does not compile again
    simulate(g, hw, "simpy")
    assert structure(g) is st

    g.add_op("b", 0, "copy", pcie_bytes=1e6)  # 100 us on another lane: overlaps
    assert structure(g) is not st
    assert len(structure(g).ids) == 2
    for engine in ("fast", "simpy"):
        assert simulate(g, hw, engine).iteration_us == pytest.approx(100.0)

    st = structure(g)
    g.add_dep("0:a", "0:b")  # now b waits for a
    assert structure(g) is not st
    for engine in ("fast", "simpy"):
        assert simulate(g, hw, engine).iteration_us == pytest.approx(200.0)

    st = structure(g)
    g.op("0:b")["pcie_bytes"] = 3e6  # in-place edit: seen after refresh()
    g.refresh()
    assert structure(g) is not st
    for engine in ("fast", "simpy"):
        assert simulate(g, hw, engine).iteration_us == pytest.approx(400.0)


def test_stale_compiled_form_refuses_to_read_changed_columns():
    from simulator.compiled import costs, structure

    hw = toy_hw(gpus_per_node=1)
    g = OpGraph(1)
    g.add_op("a", 0, "compute", flops=1e8)
    st = structure(g)
    g.add_op("b", 0, "compute", flops=1e8)
    with pytest.raises(OpGraphError, match="changed after it was compiled"):
        costs(st, hw)
    g.add_op("c", 0, "compute", flops=1e8)  # no view of the columns is left behind: the graph still grows
    assert simulate(g, hw).iteration_us == pytest.approx(300.0)
