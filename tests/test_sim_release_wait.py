"""A collective's wait for slower ranks (the calibration's coll_wait, coll_wait_launches) is a
release delay counted from when its data is ready: queued behind a busy comm lane it has
waited meanwhile and pays none of it; alone it pays all of it. Both engines agree."""

import pytest

from simulator import Collective, OpGraph, simulate
from simulator.calibration_spec import Calibration, WorldFit
from tests.test_sim_helpers import toy_hw

ENGINES = ("fast", "simpy")


def _hw(**wait):
    hw = toy_hw(gpus_per_node=2)
    hw.calibration = Calibration(worlds={2: WorldFit(**wait)})
    return hw


def _graph(first_bytes: float | None) -> OpGraph:
    """Per rank: work1 (100 us), [collective a (ring all-reduce of first_bytes) after work1],
    work2 (100 us) after work1, collective b (1e6 B: 4 + 10 us) after work2."""
    g = OpGraph(2)
    for r in range(2):
        w1 = g.add_op("work1", r, "compute", flops=1e8)
        if first_bytes is not None:
            g.add_op("a", r, "comm", collective=Collective("all_reduce", (0, 1), first_bytes, "ring"), deps=[w1])
        w2 = g.add_op("work2", r, "compute", flops=1e8, deps=[w1])
        g.add_op("b", r, "comm", collective=Collective("all_reduce", (0, 1), 1e6, "ring"), deps=[w2])
    return g


def _ev(res, name):
    return next(e for e in res.timeline.events if e.rank == 0 and e.name == name)


@pytest.mark.parametrize("engine", ENGINES)
def test_queued_collective_pays_no_wait_a_lone_one_does(engine):
    hw = _hw(coll_wait=0.5)  # wait = half the compute since the rank's previous collective
    # a: 100 us compute before it, waits 50, runs 4 + 500 us: the lane is busy until 654.
    # b: 100 us compute since a, data ready at 200, released at 250, long before the lane is free
    res = simulate(_graph(5e7), hw, engine)
    assert _ev(res, "a").start_us == pytest.approx(100.0)  # its data is ready; the wait shows on the lane
    assert _ev(res, "a").end_us == pytest.approx(654.0)
    assert _ev(res, "b").start_us == pytest.approx(654.0)
    assert _ev(res, "b").end_us == pytest.approx(668.0)  # no wait on top of the queue
    # alone (no a): 200 us compute before b, it waits 100 after its data
    lone = simulate(_graph(None), hw, engine)
    assert _ev(lone, "b").end_us == pytest.approx(200.0 + 100.0 + 14.0)


@pytest.mark.parametrize("engine", ENGINES)
def test_wait_longer_than_the_queue_pays_the_rest(engine):
    hw = _hw(coll_wait=0.5)
    res = simulate(_graph(6e6), hw, engine)  # a ends at 150 + 64 = 214; b's data is ready at 200
    assert _ev(res, "a").end_us == pytest.approx(214.0)
    assert _ev(res, "b").start_us == pytest.approx(214.0)  # the lane shows the wait the queue did not hide
    assert _ev(res, "b").end_us == pytest.approx(250.0 + 14.0)  # released 50 us after its data


@pytest.mark.parametrize("engine", ENGINES)
def test_fixed_wait_is_a_release_delay_too(engine):
    hw = _hw(coll_wait_launches=2.0)
    hw.gpu.launch_us = 20.0  # 40 us of wait, every op pays a 20 us launch
    res = simulate(_graph(5e7), hw, engine)
    # work1 ends 120, a released at 160, runs 20 + 504 -> 684; b's data ready at 240, queued
    assert _ev(res, "a").end_us == pytest.approx(684.0)
    assert _ev(res, "b").end_us == pytest.approx(684.0 + 20.0 + 14.0)
    lone = simulate(_graph(None), hw, engine)  # work2 ends 240, b released at 280
    assert _ev(lone, "b").end_us == pytest.approx(280.0 + 20.0 + 14.0)


def test_engines_agree_with_waits_on_many_collectives():
    from tests.test_sim_engine import _random_graph

    hw = toy_hw(nodes=2, gpus_per_node=2, launch_us=3.0)
    hw.calibration = Calibration(worlds={4: WorldFit(coll_wait=0.3, coll_wait_launches=5.0)})
    for seed in range(4):
        g = _random_graph(seed, ops_per_rank=60)
        a, b = simulate(g, hw, "fast"), simulate(g, hw, "simpy")
        assert a.iteration_us == pytest.approx(b.iteration_us, rel=0.05)
