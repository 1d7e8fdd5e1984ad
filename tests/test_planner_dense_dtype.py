"""The dense layers' precision (model.dense_dtype) sets the dense ops' FLOP rate."""

from dataclasses import replace

import pytest

from picasso.cli import main
from planner.errors import PlanError
from planner.explain import explain
from planner.lowering import lower
from planner.model_spec import ModelSpec
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.cost import op_busy
from simulator.hardware import load_hardware

DENSE = ("fwd/dense/bottom_mlp", "fwd/dense/top_mlp", "bwd/dense/top_mlp", "bwd/dense/bottom_mlp")


def plan_at(dtype: str | None, world: int = 8) -> Plan:
    m = get_model("dlrm-criteo-kaggle")
    if dtype is not None:
        m = replace(m, extra={**m.extra, "dense_dtype": dtype})
    return Plan(model=m, world_size=world, batch_size_per_rank=2048, packs=[PackPlan("pack0", m.table_names)])


def compute_us(lo, hw, name: str) -> tuple[float, dict]:
    attrs = next(a for _, a in lo.graph.ops() if a["name"] == name)
    return op_busy(attrs, hw)[2][0], attrs


@pytest.mark.parametrize("dtype", ["tf32", "bf16"])
def test_dense_op_time_scales_with_the_presets_rate_for_the_dtype(dtype):
    hw = load_hardware("dgx-h100")
    base, fast = lower(plan_at(None), hw), lower(plan_at(dtype), hw)
    assert base.dense_dtype == "fp32" and fast.dense_dtype == dtype and not fast.notes
    # the achieved rates: peak x the preset's measured GEMM fraction for the dtype (perf.gemm,
    # tall-skinny: the MLP layers), e.g. 67 x 0.72 / (494.5 x 0.60) for tf32 on an H100
    want = hw.flops_rate("fp32", "gemm") / hw.flops_rate(dtype, "gemm")
    assert want != pytest.approx(hw.flops_for("fp32") / hw.flops_for(dtype))  # the fractions differ by dtype
    for name in DENSE:
        t32, a32 = compute_us(base, hw, name)
        t, a = compute_us(fast, hw, name)
        assert a["dtype"] == dtype and a32["dtype"] == "fp32"
        assert a["flops"] == a32["flops"] > 0
        assert t / t32 == pytest.approx(want, rel=1e-9)
    # the embedding path and the fp32 optimizer step keep their dtype
    for name in ("fwd/pack0/cold_gather", "opt/dense/update"):
        assert compute_us(fast, hw, name)[1]["dtype"] == "fp32"
    # bf16 activations are half as many bytes, tf32 keeps fp32 storage
    scale = 0.5 if dtype == "bf16" else 1.0
    top32, top = base.op("fwd/dense/top_mlp"), fast.op("fwd/dense/top_mlp")
    params = base.dense.ops["top_mlp"].params * 4
    assert top.demand["hbm_bytes"] - params == pytest.approx(scale * (top32.demand["hbm_bytes"] - params))


def test_missing_dtype_falls_back_to_fp32_with_a_note():
    hw = load_hardware("p2res-v100")  # V100: no tf32, no bf16
    lo = lower(plan_at("tf32", hw.world_size), hw)
    assert lo.dense_dtype == "fp32" and "no tf32" in lo.notes[0]
    ref = lower(plan_at(None, hw.world_size), hw)
    for name in DENSE:
        assert compute_us(lo, hw, name) == compute_us(ref, hw, name)


def test_chosen_plan_and_baselines_use_the_same_dense_dtype():
    hw = load_hardware("dgx-h100")
    slow, fast = explain(plan_at(None), hw), explain(plan_at("bf16"), hw)
    d = fast.to_dict()
    assert d["dense_dtype"] == "bf16" and d["lowering_notes"] == []
    for name, ev in fast.baselines.items():
        assert ev.lowered.dense_dtype == "bf16", name
        assert ev.iteration_us < slow.baselines[name].iteration_us, name
    assert fast.evaluation.iteration_us < slow.evaluation.iteration_us
    assert "dense layers in bf16" in fast.text()


def test_unknown_dense_dtype_is_a_clear_error():
    m = get_model("dlrm-criteo-kaggle")
    bad = replace(m, extra={"dense_dtype": "fp8"})
    with pytest.raises(PlanError, match="dense_dtype 'fp8'"):
        bad.validate()
    with pytest.raises(PlanError, match="dense_dtype"):
        ModelSpec.from_dict(bad.to_dict())
    with pytest.raises(PlanError, match="dense_dtype"):
        lower(Plan(model=bad, world_size=8, batch_size_per_rank=64, packs=[PackPlan("p", m.table_names)]),
              load_hardware("dgx-h100"))


def test_cli_dense_dtype_reaches_plan_and_simulate(tmp_path, capsys):
    import json

    out = tmp_path / "p.json"
    argv = ["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "dgx-h100", "--baseline", "naive",
            "--batch-size", "1024", "-o", str(out), "--json"]
    assert main(argv + ["--dense-dtype", "fp32"]) == 0
    fp32 = json.loads(capsys.readouterr().out)
    assert main(argv + ["--dense-dtype", "bf16"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert fp32["dense_dtype"] == "fp32" and bf16["dense_dtype"] == "bf16"
    assert bf16["predicted_iteration_us"] < fp32["predicted_iteration_us"]
    assert Plan.load(out).model.dense_dtype == "bf16"  # the plan file keeps it
    assert main(["simulate", str(out), "--dense-dtype", "fp32", "--json"]) == 0
    sim = json.loads(capsys.readouterr().out)
    assert sim["dense_dtype"] == "fp32"
    assert sim["predicted_iteration_us"] == pytest.approx(fp32["predicted_iteration_us"], rel=1e-6)


@pytest.mark.parametrize("hardware,want", [("dgx-h100", "tf32"), ("p2res-v100", "fp32"), ("local-cpu", "fp32")])
def test_default_dense_dtype_is_tf32_on_tensor_core_gpus_only(tmp_path, capsys, hardware, want):
    """Without --dense-dtype, a GPU with a TF32 rate plans tf32 (as NVIDIA's DLRM trains), a GPU
    without one (V100) or a CPU plans fp32; the plan file records it, so the executor runs it."""
    import json

    out = tmp_path / "p.json"
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", hardware, "--baseline", "naive",
                 "--batch-size", "256", "--row-cap", "1000", "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dense_dtype"] == want
    assert Plan.load(out).model.dense_dtype == want


def test_explain_says_tf32_is_the_gpus_default(tmp_path, capsys):
    argv = ["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "dgx-h100", "--baseline", "naive",
            "--batch-size", "1024", "-o", str(tmp_path / "p.json"), "--explain"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "dense layers in tf32 (tensor-core matmuls, this GPU's default; --dense-dtype fp32" in text
    assert main(argv + ["--dense-dtype", "fp32"]) == 0
    assert "dense layers in fp32)" in capsys.readouterr().out


def test_a_models_own_dense_dtype_beats_the_hardware_default():
    from planner.dense import with_dense_dtype

    hw = load_hardware("dgx-h100")
    m = get_model("dlrm-criteo-kaggle")
    assert with_dense_dtype(m, hw).dense_dtype == "tf32"
    own = replace(m, extra={**m.extra, "dense_dtype": "fp32"})
    assert with_dense_dtype(own, hw).dense_dtype == "fp32"
    assert with_dense_dtype(own, hw, "bf16").dense_dtype == "bf16"


def test_old_plans_and_specs_with_extra_dense_dtype_load_as_the_field(tmp_path):
    """Plans and specs written before ModelSpec.dense_dtype carry it as extra.dense_dtype: they
    load with the field set (and extra without it), and save it as the field."""
    import json

    from planner.modes import DenseDtype
    from planner.presets import load_model_file

    m = replace(get_model("dlrm-criteo-kaggle"), dense_dtype=DenseDtype.BF16)
    Plan(model=m, world_size=2, batch_size_per_rank=64, packs=[PackPlan("p", m.table_names)]).save(tmp_path / "p.json")
    doc = json.loads((tmp_path / "p.json").read_text())
    assert doc["model"]["dense_dtype"] == "bf16"
    doc["model"]["extra"] = {**doc["model"]["extra"], "dense_dtype": doc["model"].pop("dense_dtype")}
    (tmp_path / "old.json").write_text(json.dumps(doc))
    old = Plan.load(tmp_path / "old.json").model
    assert old.dense_dtype is DenseDtype.BF16 and "dense_dtype" not in old.extra
    assert old.dense_precision is DenseDtype.BF16 and old.to_dict()["dense_dtype"] == "bf16"

    spec = tmp_path / "old.yaml"
    spec.write_text("name: m\narch: dlrm\nnum_dense: 2\nbottom_mlp: [4]\ntop_mlp: [1]\nextra: {dense_dtype: tf32}\n"
                    "tables:\n  - {name: a, num_rows: 10, dim: 4}\n")
    loaded = load_model_file(str(spec))
    assert loaded.dense_precision is DenseDtype.TF32 and loaded.extra == {}
    # a spec that asks nothing runs fp32 until a plan records the hardware's default
    assert get_model("dlrm-criteo-kaggle").dense_dtype is None
    assert get_model("dlrm-criteo-kaggle").dense_precision is DenseDtype.FP32
