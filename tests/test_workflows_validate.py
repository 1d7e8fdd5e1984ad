"""Validation: the sweep's variety, the comparison arithmetic, and refitting on runs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from planner.builders import build_sweep
from simulator.measured import drop_warmup, load_timeline, mean_op_durations, step_times_us
from simulator.timeline import Timeline
from validation.compare import compare, dominant_ops, predict, summary


@pytest.fixture(scope="module")
def setup():
    from planner.access import table_access
    from planner.presets import get_model
    from simulator.hardware import load_hardware

    model = get_model("dlrm-criteo-kaggle").with_row_cap(2000)
    hw = load_hardware("local-cpu")
    return model, table_access(model), hw


def hw_for(hw):
    from simulator.hardware import apply_overrides

    return lambda w: apply_overrides(hw, {"gpus_per_node": w})


def test_sweep_varies_every_knob(setup):
    model, access, hw = setup
    cases = build_sweep(model, access, hw_for(hw), n_plans=24, include_planner=False, fit_count=6)
    assert len(cases) >= 24
    assert len({c.name for c in cases}) == len(cases)
    plans = [c.plan for c in cases]
    for p in plans:
        p.validate()
    assert {p.world_size for p in plans} == {1, 2, 4}
    assert {p.micro_batches for p in plans} == {1, 2, 4}
    assert {p.batch_size_per_rank for p in plans} == {256, 512, 1024}
    assert {p.kernel_interleaving for p in plans} == {False, True}
    shardings = {pk.sharding for p in plans for pk in p.packs}
    assert shardings == {"row_wise", "table_wise", "column_wise", "replicated"}
    packed = [len(p.packs) < len(model.tables) for p in plans]
    assert any(packed) and not all(packed)  # packing on and off
    hot = {sum(p.hot_rows.values()) > 0 for p in plans}
    assert hot == {False, True}
    recipes = {c.knobs["recipe"] for c in cases}
    assert {"naive", "torchrec-like", "dp-hot-only"} <= recipes
    # hot IDs are the hottest rows, as many as the plan says
    for c in cases:
        for t, n in c.plan.hot_rows.items():
            assert len(c.hot_ids[t]) == n and len(np.unique(c.hot_ids[t])) == n
    fit = [c for c in cases if c.role == "fit"]
    validated = [c for c in cases if c.role == "validate"]
    assert len(validated) == 24 - 6 and len(fit) == len(cases) - len(validated) >= 6
    # every world the fit plans run at is fitted at every batch size of the sweep
    for w in {c.plan.world_size for c in fit}:
        assert {c.plan.batch_size_per_rank for c in fit if c.plan.world_size == w} == {256, 512, 1024}
    assert {c.knobs["recipe"] for c in validated} >= {"naive", "torchrec-like", "dp-hot-only"}


def test_sweep_includes_the_planners_choice(setup):
    model, access, hw = setup
    cases = build_sweep(model, access, hw_for(hw), n_plans=2, worlds=(2,), batches=(256,))
    assert cases[0].knobs["recipe"] == "planner"
    assert cases[0].plan.provenance.planner == "picasso.search"


def test_summary_mape_and_spearman():
    recs = [{"measured_us": m, "predicted_us": p} for m, p in ((100, 110), (200, 190), (400, 400), (800, 720))]
    s = summary(recs)
    assert s["plans"] == 4
    assert s["mape"] == pytest.approx((0.1 + 0.05 + 0.0 + 0.1) / 4)
    assert s["spearman"] == pytest.approx(1.0)
    assert s["within_10pct"] == 4
    recs[0]["predicted_us"] = 1000  # now ranked last instead of first
    assert summary(recs)["spearman"] < 0.5


def test_spearman_is_a_number_or_a_reason():
    two = summary([{"measured_us": 100, "predicted_us": 90}, {"measured_us": 200, "predicted_us": 210}])
    assert two["spearman"] is None and "at least 3" in two["spearman_reason"]
    flat = summary([{"measured_us": m, "predicted_us": 50} for m in (100, 200, 300)])
    assert flat["spearman"] is None and "predicted the same" in flat["spearman_reason"]
    same = summary([{"measured_us": 100, "predicted_us": p} for p in (90, 100, 110)])
    assert same["spearman"] is None and "measured the same" in same["spearman_reason"]
    from validation.compare import spearman_text

    assert spearman_text(two).startswith("n/a (") and spearman_text(summary([
        {"measured_us": m, "predicted_us": m} for m in (1, 2, 3)])) == "1.000"


def _tl() -> Timeline:
    tl = Timeline()
    for step in range(4):
        base = step * 1000.0
        for rank in (0, 1):
            tl.add(rank, "compute", "fwd/dense/top_mlp", base, 300 + 100 * rank, step=step)
            tl.add(rank, "comm", "fwd/pack0/a2a_ids", base + 300, 100, step=step)
            tl.add(rank, "compute", "fwd/pack0/pool", base + 400, 10, step=step)
    return tl


def test_timeline_statistics():
    tl = drop_warmup(_tl(), 2)
    assert {e.args["step"] for e in tl.events} == {2, 3}
    ops = mean_op_durations(tl)
    assert ops["fwd/dense/top_mlp"] == pytest.approx(350)
    assert step_times_us(tl) == [pytest.approx(410), pytest.approx(410)]
    assert dominant_ops(ops, share=0.7) == ["fwd/dense/top_mlp"]
    assert dominant_ops(ops, share=0.99) == ["fwd/dense/top_mlp", "fwd/pack0/a2a_ids", "fwd/pack0/pool"]


def test_chrome_trace_reads_back_as_a_timeline(tmp_path):
    tl = _tl()
    tl.save_chrome_trace(tmp_path / "t.json")
    back = load_timeline(tmp_path / "t.json")
    assert len(back.events) == len(tl.events)
    assert mean_op_durations(back) == pytest.approx(mean_op_durations(tl))
    tl.save(tmp_path / "u.json")
    assert json.loads((tmp_path / "u.json").read_text())["events"]
    assert len(load_timeline(tmp_path / "u.json").events) == len(tl.events)


def test_compare_reports_dominant_op_errors(setup):
    from planner.builders import Case
    from validation.compare import Predicted
    from validation.measure import Measured

    model, access, hw = setup
    case = build_sweep(model, access, hw_for(hw), n_plans=1, include_planner=False)[0]
    m = Measured(1000.0, 5.0, {"a": 600.0, "b": 300.0, "c": 100.0}, Timeline())
    p = Predicted(900.0, {"a": 660.0, "b": 300.0}, Timeline())
    rec = compare(Case(case.name, case.plan, {}), m, p)
    assert rec["error"] == pytest.approx(-0.1)
    ops = {o["op"]: o for o in rec["dominant_ops"]}
    assert ops["a"]["error"] == pytest.approx(0.1) and ops["b"]["error"] == 0.0
    assert "c" not in ops  # a and b already make 90% of the measured op time


def test_predict_every_sweep_plan(setup):
    from simulator.hardware import apply_overrides

    model, access, hw = setup
    cases = build_sweep(model, access, hw_for(hw), n_plans=20, include_planner=False)
    for c in cases:
        p = predict(c.plan, apply_overrides(hw, {"gpus_per_node": c.plan.world_size}), access=access)
        assert p.iteration_us > 0
        assert any(k.startswith("fwd/dense/top_mlp") for k in p.op_us)


def test_op_class_fit_recovers_known_coefficients(setup):
    """Per-op-class fixed costs and rate factors set on a 'true' machine are recovered
    from op timings of simulated runs, and predict held-out plans' iterations."""
    from planner.op_names import op_class
    from simulator.calibration import fit_op_classes, spec_for_world
    from simulator.engine import simulate
    from simulator.hardware import HardwareSpec

    model, access, hw = setup
    d = hw.to_dict()
    d["efficiency"] = {"op:fwd/dense/top_mlp": 0.25, "opfixed:fwd/dense/top_mlp": 4.0,
                       "op:bwd/dense/interaction": 0.1, "opfixed:bwd/dense/interaction": 20.0,
                       "opfixed:fwd/pack/route": 3.0, "opgap": 0.5}
    truth = HardwareSpec.from_dict(d)
    cases = build_sweep(model, access, hw_for(hw), n_plans=12, include_planner=False, batches=(256, 1024))
    runs = []
    for c in cases:
        w = c.plan.world_size
        base_graph = predict(c.plan, spec_for_world(hw, w), access=access).graph
        res = simulate(base_graph, spec_for_world(truth, w))
        meas_ops = mean_op_durations(res.timeline)
        runs.append((base_graph, w, res.iteration_us, meas_ops))
    fit, held = runs[::2], runs[1::2]
    spec1, report = fit_op_classes(hw, [(g, w, ops) for g, w, _, ops in fit], op_class)
    assert report["fwd/dense/top_mlp"]["flow_scale"] == pytest.approx(4.0, rel=0.05)
    assert report["fwd/dense/top_mlp"]["fixed_launches"] == pytest.approx(4.5, rel=0.1)  # fixed + gap
    assert report["bwd/dense/interaction"]["flow_scale"] == pytest.approx(10.0, rel=0.05)
    for graph, w, meas_it, _ in held:
        sw = spec_for_world(spec1, w)
        pred = simulate(graph, sw).iteration_us
        assert pred == pytest.approx(meas_it, rel=0.05)


def test_collective_wait_for_compute_is_recovered(setup):
    """Collectives that wait for the slowest rank in proportion to the compute before them
    (the calibration's coll_wait per world on a 'true' machine) are fitted back per world
    size, and the fitted model predicts held-out plans' iterations; without the term a pure
    size model cannot."""
    import copy

    from planner.op_names import op_class
    from simulator.calibration import fit_op_classes, spec_for_world
    from simulator.calibration_spec import Calibration
    from simulator.engine import simulate

    model, access, hw = setup
    truth = copy.deepcopy(hw)
    truth.calibration = copy.deepcopy(hw.calibration) or Calibration()
    truth.calibration.world(2).coll_wait, truth.calibration.world(4).coll_wait = 0.1, 0.4
    cases = build_sweep(model, access, hw_for(hw), n_plans=12, include_planner=False, batches=(256, 1024),
                        worlds=(2, 4))
    runs = []
    for c in cases:
        w = c.plan.world_size
        base_graph = predict(c.plan, spec_for_world(hw, w), access=access).graph
        res = simulate(base_graph, spec_for_world(truth, w))
        runs.append((base_graph, w, res.iteration_us, mean_op_durations(res.timeline)))
    fit = [r for i, r in enumerate(runs) if i % 4 < 2]  # worlds alternate: both in each half
    held = [r for i, r in enumerate(runs) if i % 4 >= 2]
    assert {w for _, w, _, _ in fit} == {w for _, w, _, _ in held} == {2, 4}
    spec1, report = fit_op_classes(hw, [(g, w, ops) for g, w, _, ops in fit], op_class)
    worlds = report["comm#collective"]["worlds"]
    assert worlds["2"]["wait_per_compute_us"] == pytest.approx(0.1, rel=0.15)
    assert worlds["4"]["wait_per_compute_us"] == pytest.approx(0.4, rel=0.15)
    assert spec1.calibration.worlds[4].coll_wait == pytest.approx(0.4, rel=0.15)
    errs = []
    for graph, w, meas_it, _ in held:
        sw = spec_for_world(spec1, w)
        errs.append(abs(simulate(graph, sw).iteration_us - meas_it) / meas_it)
    assert max(errs) < 0.05
    # the same graphs without the wait: the held-out plans are mispredicted
    no_wait = copy.deepcopy(spec1)
    for wf in no_wait.calibration.worlds.values():
        wf.coll_wait = None
    errs0 = [abs(simulate(g, spec_for_world(no_wait, w)).iteration_us - t) / t for g, w, t, _ in held]
    assert max(errs0) > 2 * max(errs)


def test_timed_steps_grow_with_short_predicted_steps():
    from validation.measure import timed_steps_for

    assert timed_steps_for(20_000.0, 8, 1.0, 40) == 40  # 50 wanted, capped
    assert timed_steps_for(50_000.0, 8, 1.0, 40) == 20
    assert timed_steps_for(400_000.0, 8, 1.0, 40) == 8  # never below the minimum
    assert timed_steps_for(20_000.0, 8, 0.0, 40) == 8  # no time target: the minimum
    assert timed_steps_for(0.0, 5, 1.0, 40) == 5


def test_passes_merge_without_mixing_their_steps():
    """Two runs of one plan: the iteration is the mean of their medians, and op durations
    and host gaps count every timed step of both, each run's steps kept apart."""
    from simulator.measured import host_gap
    from validation.measure import Measured, merge_passes

    def run(step_us: float, op_us: float) -> Measured:
        tl = Timeline()
        for s in range(3):
            t0 = s * step_us
            tl.add(0, "compute", "fwd/dense/top_mlp", t0, op_us, step=s)
            tl.add(0, "comm", "bwd/dense/allreduce", t0 + op_us, 10.0, step=s)
        return Measured(step_us, 1.0, mean_op_durations(tl), tl, timed_steps=3)

    a, b = run(100.0, 40.0), run(300.0, 80.0)
    m = merge_passes([a, b])
    assert m.iteration_us == pytest.approx(200.0)
    assert m.op_us["fwd/dense/top_mlp"] == pytest.approx(60.0)  # 3 steps at 40, 3 at 80
    assert m.op_us["bwd/dense/allreduce"] == pytest.approx(10.0)  # no step's comm queued behind another run's
    assert len(step_times_us(m.timeline)) == 6
    assert host_gap(m.timeline)[1] == pytest.approx(1.0)  # one compute op per step, steps not merged
    assert merge_passes([a]) is a


def test_unfitted_classes_name_what_the_fit_never_ran_at_that_world(setup):
    from planner.lowering import lower
    from planner.op_names import op_class
    from validation.compare import unfitted_classes

    model, access, hw = setup
    case = build_sweep(model, access, hw_for(hw), n_plans=6, worlds=(2,), batches=(256,), include_planner=False)[1]
    graph = lower(case.plan, hw_for(hw)(2), access=access, check_memory=False).graph
    classes = {op_class(a["name"]) for _, a in graph.ops() if a.get("collective") is None}
    assert "fwd/dense/top_mlp" in classes
    fitted = {"fwd/dense/top_mlp": {"worlds": {"2": {}}}, "comm#collective": {"worlds": {"4": {}}}}
    got = unfitted_classes(graph, 2, fitted)
    assert "fwd/dense/top_mlp" not in got and "comm#collective" in got
    assert set(got) == (classes - {"fwd/dense/top_mlp"}) | {"comm#collective"}
    assert "fwd/dense/top_mlp" in unfitted_classes(graph, 4, fitted)  # fitted at 2 ranks only
    every = {c: {"worlds": {"2": {}}} for c in classes | {"comm#collective"}}
    assert unfitted_classes(graph, 2, every) == []


@pytest.mark.dist
def test_a_measured_run_is_the_executors_typed_result(tmp_path):
    """validate measures through executor.process.launch's RunResult, not the stdout of a child command."""
    from executor.run.result import RunResult
    from planner.plan import PackPlan, Plan
    from planner.presets import get_model
    from traces.synth import generate_criteo
    from validation.measure import run_measured

    generate_criteo(tmp_path / "data.tsv", 400, seed=0)
    m = get_model("dlrm-criteo-kaggle").with_row_cap(200)
    plan = Plan(m, 1, 32, [PackPlan("p0", m.table_names, "row_wise")])
    plan.save(tmp_path / "plan.json")
    got = run_measured(tmp_path / "plan.json", str(tmp_path / "data.tsv"), "criteo", 1, 3, 1, tmp_path)
    assert isinstance(got.result, RunResult) and got.result.timed_steps == 3 == got.timed_steps
    assert got.iteration_us == got.result.iteration_us() > 0 and len(got.result.step_ms) == 3
    assert got.samples_per_s == got.result.samples_per_s and "fwd/p0/pool" in got.op_us


def test_workflow_parameters_are_checked_dataclasses():
    from validation.calibrate import CalibrateConfig
    from validation.demo import DemoConfig
    from validation.validate import ValidateConfig

    ValidateConfig(data="d.tsv").check()
    with pytest.raises(ValueError, match="--fit-plans"):
        ValidateConfig(data="d.tsv", plans=5, fit_plans=5).check()
    with pytest.raises(ValueError, match="--max-steps"):
        ValidateConfig(data="d.tsv", steps=9, max_steps=8).check()
    with pytest.raises(ValueError, match="--nproc"):
        CalibrateConfig(nproc=0).check()
    with pytest.raises(ValueError, match="--row-cap"):
        DemoConfig(row_cap=0).check()


def test_replay_refits_a_saved_sweep_without_running_it(setup, tmp_path):
    """`picasso validate --replay DIR`: a finished sweep's saved plans, traces and results are
    enough to refit and predict again. Here the "measurements" are simulations on a 'true'
    machine whose top MLP is 4x slower; the replayed refit recovers it for the held-out plans."""
    from simulator.calibration import spec_for_world
    from validation.replay import replay

    model, access, hw = setup
    cases, records = _saved_sweep(setup, tmp_path, _slow_top_mlp(hw))
    out = replay(tmp_path, hw)
    assert out["refit"]["op_classes"]["fwd/dense/top_mlp"]["flow_scale"] == pytest.approx(4.0, rel=0.05)
    held = [r for r in out["per_plan"] if r["role"] == "validate"]
    assert held and out["summary"]["plans"] == len(held)
    assert out["summary"]["mape"] < 0.05
    before = [abs(predict(c.plan, spec_for_world(hw, c.plan.world_size), access=access).iteration_us
                  - r["measured_us"]) / r["measured_us"] for c, r in zip(cases, records) if c.role == "validate"]
    assert np.mean(before) > 3 * out["summary"]["mape"]  # the refit did the work


def _saved_sweep(setup, tmp_path, truth):
    """A sweep saved as validate saves it, its "measurements" simulated on `truth`."""
    from simulator.calibration import spec_for_world
    from simulator.engine import simulate

    model, access, hw = setup
    cases = build_sweep(model, access, hw_for(hw), n_plans=8, include_planner=False, batches=(256, 1024),
                        worlds=(1, 2), fit_count=4)
    (tmp_path / "plans").mkdir()
    records = []
    for i, c in enumerate(cases):
        path = tmp_path / "plans" / f"{i:02d}-{c.name}.json"
        c.plan.save(path, hot_ids=c.hot_ids or None)
        res = simulate(predict(c.plan, spec_for_world(hw, c.plan.world_size), access=access).graph,
                       spec_for_world(truth, c.plan.world_size))
        res.timeline.save(path.with_name(path.stem + ".measured.json"))
        records.append({"name": c.name, "role": c.role, "knobs": c.knobs, "plan_file": str(path),
                        "measured_us": res.iteration_us})
    (tmp_path / "validate.json").write_text(json.dumps({"warmup": 0, "per_plan": records}))
    return cases, records


def _slow_top_mlp(hw):
    """A machine like `hw` whose top MLP is 4x slower."""
    import copy

    from simulator.calibration_spec import Calibration, ClassFit

    truth = copy.deepcopy(hw)
    truth.calibration = Calibration(classes={"fwd/dense/top_mlp": ClassFit(fixed_launches=6.0, rate=0.25)})
    return truth


def test_replay_writes_the_report_and_results_it_is_asked_for(setup, tmp_path, capsys):
    from picasso.cli import main

    sweep = tmp_path / "sweep"
    sweep.mkdir()
    _saved_sweep(setup, sweep, _slow_top_mlp(setup[2]))
    before = {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()}
    page, results = tmp_path / "r" / "replay.html", tmp_path / "replay.json"
    assert main(["validate", "--replay", str(sweep), "--html", str(page), "--results", str(results)]) == 0
    doc = json.loads(results.read_text())
    assert doc["summary"]["plans"] == len([r for r in doc["per_plan"] if r["role"] == "validate"]) > 0
    text = page.read_text()
    assert "validate --replay" in text and doc["per_plan"][0]["name"] in text
    # a report over one of the sweep's own files is refused before the refit, and nothing changes
    capsys.readouterr()
    assert main(["validate", "--replay", str(sweep), "--results", str(sweep / "validate.json")]) == 2
    assert "inside the input --replay" in capsys.readouterr().err
    assert {p: p.read_bytes() for p in sweep.rglob("*") if p.is_file()} == before


def test_validate_refused_for_its_inputs_creates_no_folder(tmp_path, capsys):
    from picasso.cli import main
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "d.tsv", 50, seed=0)
    out = tmp_path / "val"
    assert main(["validate", "--data", str(tmp_path / "d.tsv"), "--model", "nonsense", "-o", str(out)]) == 2
    assert "nonsense" in capsys.readouterr().err
    assert not out.exists()


def test_a_refit_worse_on_held_out_fit_plans_is_not_kept(setup, tmp_path):
    """The measured rates are exact here; a refit that makes the top MLP 4x slower predicts the
    held-out fit plans worse, so validate keeps the measured rates and says so."""
    import copy

    from simulator.calibration_spec import Calibration, ClassFit
    from validation.refit import refit_on_runs
    from validation.replay import replay

    model, access, hw = setup
    _saved_sweep(setup, tmp_path, hw)

    def worse(base, fit, profile, acc):
        spec, report = refit_on_runs(base, fit, profile, acc)
        spec = copy.deepcopy(spec)
        spec.calibration = Calibration(classes={"fwd/dense/top_mlp": ClassFit(fixed_launches=6.0, rate=0.25)})
        return spec, report

    out = replay(tmp_path, hw, refit=worse)
    choice = out["refit"]["choice"]
    assert choice["kept"] == "microbench" and choice["held_out"] == 4
    assert choice["held_out_mape_refit"] > choice["held_out_mape_microbench"]
    assert "kept the microbenchmark rates" in choice["why"]
    assert out["summary"]["mape"] < 1e-6  # the measured rates' predictions, exact here
