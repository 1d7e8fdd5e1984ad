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
    varied = apply_variants(cases, PlanVariants.GPU, hw)
    assert varied.skipped == {}
    out = varied.cases
    assert len(out) >= 16
    assert {c.plan.model.dense_dtype for c in out} == {"fp32", "tf32", "bf16"}
    assert any(t.dtype == "fp16" for c in out for t in c.plan.model.tables)
    assert any(p.placement == "host" for c in out for p in c.plan.packs)
    assert {c.plan.batch_size_per_rank for c in out} == {1024, 4096, 16384, 65536}
    assert {c.knobs["recipe"] for c in out} >= {"packed-rw", "unpacked-rw", "packed-rw-hot20%"}
    for c in out:
        c.plan.validate()
    assert apply_variants(cases, PlanVariants.NONE, hw).cases == cases


def _cpu_cases(n: int = 8):
    model = get_model("dlrm-criteo-kaggle").with_row_cap(5_000)
    hw = load_hardware("local-cpu", ["gpus_per_node=1"])
    return build_sweep(model, table_access(model), lambda w: hw, n_plans=n, worlds=(1,), batches=(256,),
                       fit_count=0, include_planner=False)


def test_on_a_cpu_spec_the_dtypes_it_cannot_run_or_predict_are_left_out_with_the_reason():
    cases = _cpu_cases()
    cpu = load_hardware("local-cpu", ["gpus_per_node=1"])  # no tf32 nor bf16 FLOP rate
    varied = apply_variants(cases, PlanVariants.GPU, cpu, cpu_bf16=True)
    assert set(varied.skipped) == {"tf32", "bf16"}
    assert "no tf32 FLOP rate" in varied.skipped["tf32"] and "no bf16 FLOP rate" in varied.skipped["bf16"]
    out = varied.cases
    assert len(out) == len(cases)
    assert {c.plan.model.dense_dtype for c in out} == {"fp32"}
    assert not any("tf32" in c.name or "bf16" in c.name for c in out)
    # 16-bit tables and host-placed rows run on a CPU rank: still varied
    assert any(t.dtype == "fp16" for c in out for t in c.plan.model.tables)
    assert any(p.placement == "host" for c in out for p in c.plan.packs)
    # a CPU spec with both rates: tf32 is still a CUDA mode; bf16 runs where the CPU has it
    rated = load_hardware("local-cpu", ["gpus_per_node=1", "gpu.flops.tf32=40GFLOP/s", "gpu.flops.bf16=80GFLOP/s"])
    with_bf16 = apply_variants(cases, PlanVariants.GPU, rated, cpu_bf16=True)
    assert set(with_bf16.skipped) == {"tf32"} and "CUDA" in with_bf16.skipped["tf32"]
    assert {c.plan.model.dense_dtype for c in with_bf16.cases} == {"fp32", "bf16"}
    without = apply_variants(cases, PlanVariants.GPU, rated, cpu_bf16=False)
    assert set(without.skipped) == {"tf32", "bf16"} and "no bf16 instructions" in without.skipped["bf16"]


def test_a_gpu_without_a_dtypes_rate_leaves_that_dtype_out():
    cases = _cpu_cases(6)
    v100 = load_hardware("p2res-v100", ["nodes=1", "gpus_per_node=1"])  # V100: no tf32, no bf16
    varied = apply_variants(cases, PlanVariants.GPU, v100)
    assert set(varied.skipped) == {"tf32", "bf16"}
    assert {c.plan.model.dense_dtype for c in varied.cases} == {"fp32"}
