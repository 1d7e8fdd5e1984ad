"""The collectives' microbenchmark sizes let their bandwidth show (executor.measure.microbench.COLL_BYTES).

With 4 gloo ranks on this 2-core machine a collective has a fixed cost of 3-7 ms (ranks
waiting to be scheduled), so up to 4 MiB its time hardly depends on its size. Fitted on those
sizes, the all-reduce's bandwidth came out 4.4 GB/s (13 GB/s on another day) where the large
sizes show ~1 GB/s: hot rows, whose gradients ride the all-reduce, looked nearly free, and the
search put 64k of them into a plan that ran 0.78x TorchRec's plan (bench_pooled_gloo)."""

from __future__ import annotations

import pytest

from executor.measure.microbench import COLL_BYTES, COLL_BYTES_QUICK
from simulator.calibration import collective_factors, fit_collectives

# measured on this machine (2 cores, 4 gloo ranks, torch 2.13.0 CPU), 2026-11-25: world, kind,
# bytes per rank, microseconds (slowest rank's median), as bench_collectives records them
MEASURED_W4 = """
all_to_all 1024 3681
all_reduce 1024 7134
all_to_all 1048576 4524
all_reduce 1048576 4936
all_to_all 4194304 3220
all_reduce 4194304 8489
all_to_all 16777216 13946
all_reduce 16777216 26276
all_to_all 67108864 49475
all_reduce 67108864 106249
"""


def _rows(sizes: set[int]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for line in MEASURED_W4.strip().splitlines():
        kind, nbytes, us = line.split()
        if int(nbytes) in sizes:
            out.setdefault(kind, []).append({"world": 4, "bytes": int(nbytes), "us": float(us)})
    return out


def _slope_rate(kind: str) -> float:
    """Bus bandwidth from the two largest sizes alone (their difference cancels the fixed cost)."""
    rows = sorted(_rows({1 << 24, 1 << 26})[kind], key=lambda r: r["bytes"])
    factor, _ = collective_factors(kind, 4)
    return factor * (rows[1]["bytes"] - rows[0]["bytes"]) / ((rows[1]["us"] - rows[0]["us"]) * 1e-6)


@pytest.mark.parametrize("sizes", [COLL_BYTES, COLL_BYTES_QUICK], ids=["full", "quick"])
@pytest.mark.parametrize("kind", ["all_reduce", "all_to_all"])
def test_the_fitted_bandwidth_is_the_one_large_collectives_show(kind, sizes):
    fit = fit_collectives(_rows(set(sizes)), launch_us=33.7)[kind]  # sizes not measured here are left out
    truth = _slope_rate(kind)
    assert 0.5 < fit.rate / truth < 2.0, (kind, fit.rate / 1e9, truth / 1e9, sorted(sizes))

