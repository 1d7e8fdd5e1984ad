"""Calibration: the least-squares fit recovers known coefficients; the spec carries them."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
import pytest

from simulator.calibration import (
    CalibrationError,
    calibrated_spec,
    calibrated_worlds,
    collective_factors,
    fit_affine,
    fit_samples,
    spec_for_world,
)
from simulator.hardware import load_hardware


def synthetic_samples(rng: np.random.Generator, noise: float = 0.0) -> list[dict]:
    """Measurements generated from known coefficients (optionally with relative noise)."""
    out = []
    for n in (256, 2048, 16384, 65536):
        for dim in (8, 16, 64):
            b = 2 * n * dim * 4
            us = 20.0 + b / 5e9 * 1e6
            out.append({"kind": "gather", "n": n, "dim": dim, "bytes": b, "us": us * (1 + noise * rng.standard_normal())})
    for m in (128, 512, 2048):
        for k, nn in ((13, 512), (512, 256), (256, 16)):
            f = 2.0 * m * k * nn
            out.append({"kind": "gemm", "phase": "fwd", "flops": f, "us": (30.0 + f / 4e10 * 1e6)})
    for world in (2, 4):
        for b in (1 << 10, 1 << 14, 1 << 18, 1 << 22):
            # launch (the fitted fixed cost of local ops, 25 us) + alpha steps + bytes / bus bandwidth
            s, steps = collective_factors("all_to_all", world)
            out.append({"kind": "all_to_all", "world": world, "bytes": b,
                        "us": 25.0 + steps * 100.0 + s * b / 1e9 * 1e6})
            s, steps = collective_factors("all_reduce", world)
            out.append({"kind": "all_reduce", "world": world, "bytes": b,
                        "us": 25.0 + steps * 100.0 + s * b / 2e9 * 1e6})
    return out


def test_fit_recovers_known_coefficients():
    fits = fit_samples(synthetic_samples(np.random.default_rng(0)))
    assert fits["gather"].rate == pytest.approx(5e9, rel=1e-3)
    assert fits["gather"].latency_us == pytest.approx(20.0, rel=1e-3)
    assert fits["gemm_fwd"].rate == pytest.approx(4e10, rel=1e-3)
    assert fits["gemm_fwd"].latency_us == pytest.approx(30.0, rel=1e-3)
    assert fits["all_to_all"].rate == pytest.approx(1e9, rel=1e-3)
    assert fits["all_to_all"].latency_us == pytest.approx(100.0, rel=1e-3)
    assert fits["all_reduce"].rate == pytest.approx(2e9, rel=1e-3)
    assert fits["all_reduce"].latency_us == pytest.approx(100.0, rel=1e-3)  # one alpha, shared
    for f in fits.values():
        assert f.rel_max < 1e-3


def test_fit_is_robust_to_one_outlier():
    s = synthetic_samples(np.random.default_rng(1), noise=0.02)
    gathers = [x for x in s if x["kind"] == "gather"]
    gathers[5]["us"] *= 5  # one sample hit by another job on a shared machine
    f = fit_samples(gathers)["gather"]
    assert f.rate == pytest.approx(5e9, rel=0.1)
    assert f.rel_max > 0.7  # the outlier shows (predicted ~1/5 of it) in the residuals ...
    assert np.median(np.abs(f.residuals)) < 0.05  # ... the rest fits


def test_two_term_gather_fit():
    n = np.array([256, 2048, 16384, 65536] * 2, dtype=float)
    b = n * np.repeat([64.0, 256.0], 4)
    t = 10 + 0.02 * n + b / 4e9 * 1e6
    f = fit_affine("gather_rows", b, t, "B/s", items=n)
    assert f.per_item_us == pytest.approx(0.02, rel=1e-3)
    assert f.rate == pytest.approx(4e9, rel=1e-3)
    assert float(f.predict_us(b[0], items=n[0])) == pytest.approx(t[0], rel=1e-6)


def test_collective_factors_closed_forms():
    assert collective_factors("all_to_all", 4) == (0.75, 1.0)
    assert collective_factors("all_reduce", 4) == (1.5, 6.0)
    with pytest.raises(CalibrationError):
        collective_factors("gossip", 4)


def test_bad_measurements_raise_one_clear_error():
    with pytest.raises(CalibrationError, match="positive"):
        fit_affine("gather", [1.0, 2.0], [1.0, -1.0], "B/s")
    with pytest.raises(CalibrationError, match="at least"):
        fit_affine("gather", [1.0], [1.0], "B/s")
    with pytest.raises(CalibrationError, match="kind"):
        fit_samples([{"us": 1.0}])


def test_spec_carries_per_world_factors(tmp_path):
    base = load_hardware("local-cpu")
    fits2 = fit_samples(synthetic_samples(np.random.default_rng(0)))
    rows1 = [x for x in synthetic_samples(np.random.default_rng(0)) if x["kind"] in ("gather", "gemm")]
    for r in rows1:
        r["us"] /= 2  # one rank alone runs twice as fast
    fits1 = fit_samples(rows1)
    hw = calibrated_spec(base, {1: fits1, 2: fits2}, 2)
    assert hw.gpus_per_node == 2
    assert calibrated_worlds(hw) == [1, 2]
    assert hw.efficiency["hbm"] == pytest.approx(5e9 / base.gpu.hbm_bw, rel=1e-3)
    assert hw.efficiency["compute"] == pytest.approx(4e10 / base.flops_for("fp32"), rel=1e-3)
    assert hw.efficiency["all_to_all"] == pytest.approx(1e9 / base.intra_bw(), rel=1e-3)
    hw1 = spec_for_world(hw, 1)
    assert hw1.gpus_per_node == 1
    assert hw1.efficiency["hbm"] == pytest.approx(2 * hw.efficiency["hbm"], rel=0.05)
    # 4 ranks were never measured: the nearest world (2) is used, collectives included.
    hw4 = spec_for_world(hw, 4)
    assert hw4.gpus_per_node == 4 and hw4.efficiency["all_reduce"] == hw.efficiency["all_reduce"]
    # The spec round-trips through JSON.
    path = tmp_path / "hw.json"
    hw.save(path)
    again = load_hardware(path)
    assert again.efficiency == hw.efficiency
    assert json.loads(path.read_text())["gpus_per_node"] == 2


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory) -> tuple[Path, dict]:
    """`picasso calibrate --nproc 2 --quick` once for the module: its spec's path and its --json report
    (its fit file holds every microbenchmark sample, at 1 and 2 ranks)."""
    from picasso.cli import main

    out = tmp_path_factory.mktemp("calibrate") / "hw.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["calibrate", "--nproc", "2", "--quick", "-o", str(out), "--json"]) == 0
    return out, json.loads(printed.getvalue())


@pytest.mark.dist
def test_microbenchmarks_run_in_two_gloo_ranks(calibrated):
    out, _ = calibrated
    samples = json.loads(out.with_name("hw.fit.json").read_text())["samples"]["2"]  # run_microbenchmarks(2, quick)
    kinds = {s["kind"] for s in samples}
    assert {"gather", "pool", "gemm", "all_to_all", "all_reduce"} <= kinds
    assert all(s["us"] > 0 and s["nproc"] == 2 for s in samples)
    fits = fit_samples(samples)
    # A loopback all-to-all moves at least 10 MB/s and a gather at least 100 MB/s on any machine.
    assert fits["all_to_all"].rate > 1e7 and fits["gather"].rate > 1e8


@pytest.mark.dist
def test_calibrate_command_writes_a_loadable_spec(calibrated):
    out, report = calibrated
    hw = load_hardware(out)
    assert hw.gpus_per_node == 2 and calibrated_worlds(hw) == [1, 2]
    for key in ("compute", "hbm", "all_to_all", "all_reduce"):
        assert hw.efficiency[key] > 0
    assert any(k.startswith("fit.w2.") for k in hw.source)  # residuals travel with the spec
    fit = json.loads(out.with_name("hw.fit.json").read_text())
    assert fit["fits"]["2"]["all_to_all"]["n"] >= 3
    assert report["residuals"]["2"]["samples"] > 20


def test_cli_bad_input_is_one_line(tmp_path, capsys):
    from picasso.cli import main

    assert main(["calibrate", "--nproc", "0", "-o", str(tmp_path / "x.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--nproc" in err[0]
    assert main(["validate", "--data", str(tmp_path / "missing.tsv"), "-o", str(tmp_path / "v")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "missing.tsv" in err[0]
    assert main(["validate", "--data", "x", "--plans", "5", "--fit-plans", "5"]) == 2
    assert "fit-plans" in capsys.readouterr().err
