"""The refit's model forms per world (simulator.calibration._choose_form): the priors that come
before the leave-one-plan-out score when a world has few fit plans."""

from __future__ import annotations

import numpy as np

from simulator.calibration import _choose_form, _fit_form


def _rows(flow, launch, meas):
    return np.stack([np.asarray(flow, float), np.full(len(flow), float(launch)), np.asarray(meas, float),
                     np.ones(len(flow))], axis=1)


def test_a_collective_is_its_microbenchmark_scaled_plus_a_wait_for_slower_ranks():
    # three plans: collectives with compute before them wait for slower ranks; one issued
    # right behind another (pre 0) pays its microbenchmarked cost (x1.4) only
    flow = [900.0, 900.0, 900.0, 1800.0, 1800.0, 900.0]
    pre = np.array([10000.0, 0.0, 20000.0, 5000.0, 0.0, 40000.0])
    meas = [1.4 * (f + 30.0) + 0.15 * p for f, p in zip(flow, pre)]
    rows = _rows(flow, 30.0, meas)
    plans = np.array([0, 0, 1, 1, 2, 2])
    form = _choose_form(rows, pre, plans, True, True, 3)
    assert form == "skew"
    used, (k, _, c, a) = _fit_form(form, rows, pre, True, 3)
    assert used == "skew" and abs(k - 1.4) < 1e-6 and abs(c - 0.15) < 1e-6 and a == 0.0


def test_a_compute_class_whose_sizes_span_keeps_a_fixed_cost_and_a_rate():
    # a 1-rank dense op of a sweep's 4 fit plans (micro-batches of 128-512; weights make each
    # plan count alike): a fixed cost and a rate. The leave-one-plan-out score alone
    # preferred one scale by a hair, which over-predicted 1-rank plans at batch 512-1024
    tiny, small, big, launch = 282.9227160180241, 565.8454320360482, 1131.6908640720965, 10.645784711606556
    rows = np.array([[tiny, launch, m, 0.25] for m in (714.6161625314562, 667.3942877569061, 675.2373747985985,
                                                       700.1590248819411)]
                    + [[big, launch, m, 0.5] for m in (1654.7581498798536, 1568.829024927254)]
                    + [[small, launch, m, 1.0] for m in (1257.469812708223, 1113.2553249353805)])
    plans = np.array([4, 4, 4, 4, 5, 5, 6, 9])
    assert _choose_form(rows, np.zeros(8), plans, False, True, 3) == "own"
