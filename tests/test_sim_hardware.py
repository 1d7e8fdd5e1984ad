import json

import pytest

from simulator.hardware import PRESETS, HardwareError, HardwareSpec, load_hardware, parse_quantity
from tests.test_sim_helpers import toy_hw


@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_round_trip(name, tmp_path):
    hw = load_hardware(name)
    assert hw.world_size == hw.nodes * hw.gpus_per_node
    assert hw.gpu.hbm_bw > 0 and hw.gpu.flops["fp32"] > 0
    for suffix in (".yaml", ".json"):
        p = tmp_path / f"hw{suffix}"
        hw.save(p)
        assert load_hardware(str(p)) == hw


def test_preset_figures():
    assert load_hardware("p2res-v100").world_size == 32
    assert load_hardware("p2res-v100").gpu.hbm_bytes == 32e9
    assert load_hardware("dgx-h100").gpu.hbm_bw == 3.35e12
    assert load_hardware("dgx-a100").nic_bw == 200e9 / 8
    assert load_hardware("local-cpu").kind == "cpu"


@pytest.mark.parametrize("text,value", [
    ("3.35TB/s", 3.35e12), ("200Gbit/s", 2.5e10), ("80GiB", 80 * 2**30), ("5us", 5.0), ("2ms", 2000.0),
    ("312TFLOP/s", 312e12), ("1e9", 1e9), ("64KB", 64e3),
])
def test_parse_quantity(text, value):
    assert parse_quantity(text) == pytest.approx(value)


def test_overrides_with_units():
    hw = load_hardware("dgx-h100", ["gpu.hbm_bw=3TB/s", "nodes=4", "gpus_per_node=2", "nic_latency_us=1ms",
                                    "efficiency.gather=0.5", "gpu.flops.fp16=1PFLOP/s"])
    assert hw.gpu.hbm_bw == 3e12 and hw.world_size == 8 and hw.nic_latency_us == 1000.0
    assert hw.eff("gather") == 0.5 and hw.eff("unknown") == 1.0 and hw.gpu.flops["fp16"] == 1e15
    assert load_hardware("dgx-h100", {"device.hbm_bw": "1TB/s"}).gpu.hbm_bw == 1e12


@pytest.mark.parametrize("override,needle", [
    ("gpu.hbm_bw=-3TB/s", "gpu.hbm_bw"),
    ("gpu.hbmbw=3TB/s", "unknown key 'gpu.hbmbw'"),
    ("gpu.hbm_bw=3GB", "expected a bw unit"),
    ("nodes=0", "nodes"),
    ("gpu.hbm_bw=fast", "cannot read quantity"),
    ("gpu.hbm_bw=3XB/s", "unknown unit"),
    ("nic_per=switch", "nic_per"),
    ("novalue", "expected key=value"),
])
def test_bad_overrides_one_clear_line(override, needle):
    with pytest.raises(HardwareError) as e:
        load_hardware("dgx-a100", [override])
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_bad_files(tmp_path):
    good = load_hardware("dgx-a100").to_dict()
    cases = {
        "missing": ({k: v for k, v in good.items() if k != "pcie_bw"}, "missing key 'pcie_bw'"),
        "unknown": ({**good, "warp_drive": 1}, "unknown key 'warp_drive'"),
        "negative": ({**good, "nic_bw": -1}, "nic_bw"),
        "bad_gpu": ({**good, "gpu": {**good["gpu"], "hbm": 1}}, "gpu: unknown key 'hbm'"),
    }
    for name, (d, needle) in cases.items():
        p = tmp_path / f"{name}.json"
        p.write_text(json.dumps(d))
        with pytest.raises(HardwareError, match=needle):
            load_hardware(str(p))
    with pytest.raises(HardwareError, match="neither a preset"):
        load_hardware("no-such-cluster")
    (tmp_path / "broken.yaml").write_text("nodes: [1,\n")
    with pytest.raises(HardwareError, match="not valid YAML"):
        load_hardware(str(tmp_path / "broken.yaml"))


def test_hand_built_spec_validated():
    with pytest.raises(HardwareError, match="kind"):
        toy_hw(kind="tpu")
    assert isinstance(toy_hw(), HardwareSpec)
