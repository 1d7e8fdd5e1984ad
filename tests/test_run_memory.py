"""Memory that matches the plan: measured peaks beside the prediction, the pre-launch refusal,
--verify's stated cost, and table initialisation without full-size temporaries."""

from __future__ import annotations

import json
import tracemalloc
from dataclasses import replace

import numpy as np
import pytest
import torch

from picasso.cli import main
from planner.model_spec import TableSpec
from planner.plan import PackPlan, Plan
from planner.presets import get_model


def _small_model():
    return replace(get_model("dlrm-criteo-kaggle").with_row_cap(500), bottom_mlp=(16, 16), top_mlp=(16, 1))


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("runmem")
    generate_criteo(d / "data.tsv", 1000, seed=0)
    m = _small_model()
    plan = Plan(m, 2, 32, [PackPlan("pack0", m.table_names[:20], "row_wise"),
                            PackPlan("pack1", m.table_names[20:], "replicated")],
                hot_rows={"C1": 50}, micro_batches=2, kernel_interleaving=True)
    plan.save(d / "plan.json", hot_ids={"C1": np.arange(50)})
    # one table of 4 x 10^10 rows x 16 floats (2.3 TiB) on every rank: no machine here holds it
    huge = replace(m, tables=(TableSpec("C1", 4 * 10**10, 16), *m.tables[1:]))
    Plan(huge, 2, 32, [PackPlan("pack0", huge.table_names, "replicated")]).save(d / "huge.json")
    return d


def _no_launch(*a, **k):
    raise AssertionError("a rank was started")


def test_plan_larger_than_the_machine_is_refused_before_any_rank(setup, capsys, monkeypatch):
    monkeypatch.setattr("executor.process.launch.launch", _no_launch)
    rc = main(["run", str(setup / "huge.json"), "--data", str(setup / "data.tsv"), "--nproc", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "rank 0 does not fit in this machine's RAM" in err[0] and "short by" in err[0], err


def test_verify_states_its_cost_and_refuses_rather_than_being_killed(setup, capsys, monkeypatch):
    from executor.run import memory as run_memory
    from executor.run.reference import reference_bytes

    plan = Plan.load(setup / "plan.json")
    pred = run_memory.predicted_peaks(plan, "cpu", str(setup / "data.tsv"), "criteo", False, 3, verify=False)
    need = sum(pred["predicted_bytes_per_rank"])
    cost = reference_bytes(plan, 3)
    assert cost >= sum(t.num_rows * t.dim * 4 for t in plan.model.tables)  # it holds every full table
    # room for the two ranks, not for the reference as well
    monkeypatch.setattr(run_memory, "available_ram", lambda: int(need + cost / 2))
    monkeypatch.setattr("executor.process.launch.launch", _no_launch)
    rc = main(["run", str(setup / "plan.json"), "--data", str(setup / "data.tsv"), "--steps", "3", "--verify"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert "--verify's reference on rank 0" in err[0] and "short by" in err[0], err


def test_streaming_reader_and_cpu_runtime_are_in_the_prediction(setup):
    from planner.memory import CPU_RUNTIME, INPUT_READER, run_memory

    plan = Plan.load(setup / "huge.json")
    rep = run_memory(plan, "cpu")
    table = 4 * 10**10 * 16 * 4
    # the replicated pack's packed-row index while it is initialised (8 bytes a row) is the peak
    assert rep.rank_peak[0] >= table + 8 * plan.pack_rows(plan.packs[0]) + CPU_RUNTIME
    small_plan = Plan.load(setup / "plan.json")
    small = run_memory(small_plan, "cpu")
    assert small.rank_peak.min() >= CPU_RUNTIME + INPUT_READER
    # the hot-row index: one int64 per row of the pack with hot rows, on every rank
    assert list(small.hbm["hot_index"]) == [8 * small_plan.pack_rows(small_plan.packs[0])] * 2


def test_table_init_streams_in_chunks_and_stays_bit_identical():
    """A 10M-row table: no full-size numpy temporaries (numpy allocations are traced), and
    every row as the counter-based generator gives it on its own."""
    from executor.sparse.init_rng import init_values
    from executor.sparse.layout import INIT_CHUNK_ELEMS, init_table_rows

    m = get_model("dlrm-criteo-kaggle")
    spec = m.table("C3")
    tracemalloc.start()
    w = init_table_rows(m, "C3", seed=3)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 8 * INIT_CHUNK_ELEMS["cpu"] * 4, peak  # a few chunks, not 10M rows
    index = m.table_names.index("C3")
    for lo in (0, 7 * 65_536 + 5, spec.num_rows - 1000):
        rows = torch.arange(lo, lo + 1000)
        assert torch.equal(w[lo : lo + 1000], init_values(spec, index, 3, rows))


@pytest.mark.dist
def test_run_reports_measured_peak_memory_beside_the_prediction(setup, capsys):
    rc = main(["run", str(setup / "plan.json"), "--data", str(setup / "data.tsv"), "--steps", "4", "--json"])
    out = capsys.readouterr().out
    assert rc == 0, out
    pm = json.loads(out)["peak_memory"]
    measured, predicted = pm["measured_bytes_per_rank"], pm["predicted_bytes_per_rank"]
    assert len(measured) == len(predicted) == 2
    assert all(m > 100 << 20 for m in measured)  # a torch process's RSS, not a placeholder
    # within +15% of the prediction, and not far below it either
    assert all(0.6 < r <= 1.15 for r in pm["measured_over_predicted"]), pm


def test_preload_of_a_converted_folder_is_sized_from_its_manifest(setup):
    """`picasso run --data FOLDER --preload` sizes its input from the manifest's rows (it read
    the folder as a file: 'Is a directory')."""
    from executor.run.memory import predicted_peaks
    from traces.convert import convert

    convert([str(setup / "data.tsv")], "criteo", setup / "converted")
    plan = Plan.load(setup / "plan.json")
    folder = predicted_peaks(plan, "cpu", str(setup / "converted"), "criteo", True, 4, False)
    text = predicted_peaks(plan, "cpu", str(setup / "data.tsv"), "criteo", True, 4, False)
    assert folder["predicted_bytes_per_rank"] == pytest.approx(text["predicted_bytes_per_rank"], rel=0.2)
