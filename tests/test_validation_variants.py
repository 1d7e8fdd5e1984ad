"""validate --variants gpu: a one-rank sweep of 16+ plans holds every dense dtype, 16-bit
tables, host-placed rows, packing on and off and hot rows, and every plan still validates."""

from __future__ import annotations

from planner.access import table_access
from planner.builders import build_sweep
from planner.presets import get_model
from simulator.hardware import load_hardware
from validation.variants import PlanVariants, apply_variants


def test_gpu_variants_cover_the_knobs():
    model = get_model("dlrm-criteo-kaggle").with_row_cap(50_000)
    hw = load_hardware("h200", ["nodes=1", "gpus_per_node=1"])
    cases = build_sweep(model, table_access(model), lambda w: hw, n_plans=20, worlds=(1,),
                        batches=(1024, 4096, 16384, 65536), fit_count=6)
    out = apply_variants(cases, PlanVariants.GPU)
    assert len(out) >= 16
    assert {c.plan.model.extra["dense_dtype"] for c in out} == {"fp32", "tf32", "bf16"}
    assert any(t.dtype == "fp16" for c in out for t in c.plan.model.tables)
    assert any(p.placement == "host" for c in out for p in c.plan.packs)
    assert {c.plan.batch_size_per_rank for c in out} == {1024, 4096, 16384, 65536}
    assert {c.knobs["recipe"] for c in out} >= {"packed-rw", "unpacked-rw", "packed-rw-hot20%"}
    for c in out:
        c.plan.validate()
    assert apply_variants(cases, PlanVariants.NONE) == cases
