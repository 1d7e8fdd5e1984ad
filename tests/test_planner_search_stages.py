"""The search as named stages over one state (planner.search.Candidates): run by hand, the
stages give exactly what search() gives, and each stage only ever improves the best plan."""

from __future__ import annotations

from planner.access import table_access
from planner.presets import get_model
from planner.search import FINAL_TOP, STAGES, Candidates, enumerate_layouts, final_stage, search
from simulator.hardware import load_hardware


def test_the_stages_by_hand_are_the_search():
    model, hw = get_model("dlrm-criteo-kaggle"), load_hardware("dgx-h100", ["nodes=2"])
    access = table_access(model, None)
    c = Candidates(model, hw, access, 1024, time_budget_s=600.0, progress=None)
    enumerate_layouts(c, (1, 2, 4))
    assert c.layouts[0].label == "dp" and any(lay.label == "split1" for lay in c.layouts)
    assert c.ks == [1, 2, 4]
    bests = []
    for stage in STAGES:
        stage(c)
        bests.append(c.best.iteration_us)
    assert [s.__name__ for s in STAGES] == ["structure_stage", "peer_stage", "hot_scale_stage", "fused_pooled_stage", "sharding_stage",
                                            "table_row_wise_stage", "exchange_stage", "bucket_stage", "layer_stage", "ids_stage"]
    assert bests == sorted(bests, reverse=True)  # a stage never makes the best worse
    chosen = final_stage(c, top_k=FINAL_TOP)
    res = search(model, hw, None, 1024, access=access, time_budget_s=600.0, micro_batch_options=(1, 2, 4))
    assert [e.label for e in res.candidates] == [e.label for e in c.log]
    assert res.best.label == chosen.label and res.best.iteration_us == chosen.iteration_us


def test_the_ids_stage_tries_earlier_launches_of_the_next_steps_ids():
    from dataclasses import replace

    from planner.search import _plan_key, ids_stage

    model = get_model("dlrm-dcnv2")
    hw = load_hardware("dgx-h100", ["nodes=2"])
    c = Candidates(model, hw, table_access(model), 1024, 600.0, None)
    enumerate_layouts(c, (2, 4))
    for stage in STAGES[: STAGES.index(ids_stage)]:
        stage(c)
    top = [ev for ev in c.ranked()[:FINAL_TOP] if ev.plan.pipelines_inputs and ev.plan.micro_batches > 1]
    assert top
    ids_stage(c)
    tried = {(e.label, e.plan.ids_after_mb) for e in c.log if e.plan.ids_after_mb is not None}
    for ev in top:  # the first and the middle micro-batch, each a candidate of its own
        k = ev.plan.micro_batches
        want = {(f"{ev.label} ids@mb{mb}", mb) for mb in {0, k // 2} - {k - 1}}
        assert want <= tried, (ev.label, want - tried)
        assert _plan_key(replace(ev.plan, ids_after_mb=0)) != _plan_key(ev.plan)
