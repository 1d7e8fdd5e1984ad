"""The refit reads a collective's wait for slower ranks as a release delay: measured events
that sat queued behind their rank's comm lane hid it (simulator.measured.queue_delays,
simulator.calibration.hidden_wait), so the fit takes the wait from the lone ones and the
collective's own cost from the queued ones; the spec stores the wait's fixed part."""

from __future__ import annotations

import numpy as np
import pytest

from simulator.calibration import _choose_form, _fit_form, _predict_form
from simulator.calibration_spec import Calibration


def _rows(flow, launch, meas):
    return np.stack([np.asarray(flow, float), np.full(len(flow), float(launch)), np.asarray(meas, float),
                     np.ones(len(flow))], axis=1)


def test_queued_collectives_show_their_own_cost_lone_ones_the_wait_too():
    k, c, a, launch = 1.5, 0.2, 40.0, 30.0
    # plan 0: lone exchanges of spread sizes, some after compute (pre); plan 1: exchanges issued
    # in a burst, each queued 5 ms behind the previous one: the wait passed in the queue
    flow = np.array([300.0, 900.0, 2700.0, 8100.0, 300.0, 900.0, 300.0, 900.0, 2700.0])
    pre = np.array([0.0, 5000.0, 0.0, 20000.0, 10000.0, 0.0, 3000.0, 0.0, 8000.0])
    queued = np.array([0, 0, 0, 0, 0, 0, 5000.0, 5000.0, 5000.0])
    meas = k * (launch + flow) + np.maximum(a * launch + c * pre - queued, 0.0)
    rows = _rows(flow, launch, meas)
    plans = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1])
    q = queued[:, None]
    assert _choose_form(rows, pre, plans, True, True, 3, q) == "skew"
    used, coef = _fit_form("skew", rows, pre, True, 3, q)
    assert used == "skew"
    assert coef == pytest.approx((k, k, c, a), rel=1e-3)
    assert _predict_form(coef, rows, pre, q) == pytest.approx(meas, rel=1e-3)
    # the queued ones pay their own cost only
    assert _predict_form(coef, rows[6:], pre[6:], q[6:]) == pytest.approx(k * (launch + flow[6:]), rel=1e-3)


def test_queue_delays_per_collective_event():
    from simulator.measured import queue_delays
    from simulator.timeline import Timeline

    tl = Timeline()
    tl.add(0, "compute", "fwd/p0/dedup", 0.0, 100.0, step=0)
    for i, end in enumerate((300.0, 500.0, 900.0)):  # launched at once: they run one after another
        tl.add(0, "comm", f"fwd/p{i}/a2a_ids", 100.0, end - 100.0, step=0)
    tl.add(1, "comm", "fwd/p1/a2a_ids", 100.0, 50.0, step=0)  # another rank's lane is its own
    assert queue_delays(tl) == {"fwd/p0/a2a_ids": [0.0], "fwd/p1/a2a_ids": [200.0, 0.0], "fwd/p2/a2a_ids": [400.0]}


def test_fixed_wait_round_trips_through_the_spec():
    cal = Calibration.from_dict({"worlds": {"4": {"coll_wait": 0.1, "coll_wait_launches": 40.0}}})
    assert cal.resolve(4).coll_wait_launches == 40.0 and not cal.resolve(4).empty
    assert Calibration.from_dict(cal.to_dict()).worlds[4].coll_wait_launches == 40.0
    assert cal.resolve(1).coll_wait_launches == 40.0  # the nearest world's, as every world figure
