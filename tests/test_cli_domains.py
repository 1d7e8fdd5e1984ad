"""Every numeric flag has a domain, checked while the command line is parsed (before any work) and
refused in one line naming the flag; 0 never stands for "not given". Hardware figures have physical
ranges, and a column of a log takes one role."""

from __future__ import annotations

import json
import os

import pytest

from picasso.cli import main


def _cli(argv: list[str], capsys) -> tuple[int, list[str]]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse refuses by exiting
        rc = exc.code
    return rc, capsys.readouterr().err.strip().splitlines()


def _refused(rc: int, err: list[str], *words: str) -> None:
    assert rc == 2, err
    assert len(err) == 1, err
    assert "Traceback" not in err[0]
    for w in words:
        assert w in err[0], err


@pytest.mark.parametrize("argv, flag", [
    (["synth", "--rows", "0"], "--rows"),
    (["synth", "--rows", "1e30"], "--rows"),
    (["synth", "--rows", "5", "--zipf-s", "nan"], "--zipf-s"),
    (["synth", "--rows", "5", "--zipf-s", "-3"], "--zipf-s"),
    (["synth", "--rows", "5", "--click-rate", "1.5"], "--click-rate"),
    (["synth", "--rows", "5", "--seed", "-1"], "--seed"),
    (["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--batch-size", "0"], "--batch-size"),
    (["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--scale-to", "0"], "--scale-to"),
    (["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--time-budget", "nan"], "--time-budget"),
    (["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--time-budget", "-1"], "--time-budget"),
    (["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--row-cap", "inf"], "--row-cap"),
    (["export", "p.json", "--torchrec", "--gpus-per-node", "0"], "--gpus-per-node"),
    (["export", "p.json", "--torchrec", "--gpus-per-node", "-3"], "--gpus-per-node"),
    (["analyze", "d.csv", "--format", "csv", "--batch-size", "0"], "--batch-size"),
    (["convert", "d.csv", "--format", "csv", "--shard-rows", "0"], "--shard-rows"),
    (["simulate", "p.json", "--scale-to", "-5"], "--scale-to"),
    (["validate", "--data", "d", "--timed-seconds", "inf"], "--timed-seconds"),
    (["calibrate", "--nproc", "0"], "--nproc"),
], ids=lambda v: "_".join(v) if isinstance(v, list) else "")
def test_a_flag_outside_its_domain_is_refused_before_any_work(tmp_path, capsys, monkeypatch, argv, flag):
    monkeypatch.chdir(tmp_path)
    rc, err = _cli([*argv, "-o", "out"], capsys)
    _refused(rc, err, flag, "expected")
    assert os.listdir(tmp_path) == []


def test_synth_refuses_more_rows_than_the_disk_holds(tmp_path, capsys, monkeypatch):
    import shutil

    from traces import synth

    real = shutil.disk_usage
    monkeypatch.setattr(synth.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 20))
    out = tmp_path / "big.tsv"
    rc, err = _cli(["synth", "--rows", "100000", "-o", str(out)], capsys)
    _refused(rc, err, str(out), "No space left on device", "MB free")
    assert not out.exists()


@pytest.mark.parametrize("flags, says", [
    (["--dense", "i1", "--categorical", "i1,c1"], "'i1' is both dense and categorical"),
    (["--skip", "label"], "'label' is both the label and skipped"),
    (["--label", "c1", "--categorical", "c1"], "'c1' is both the label and categorical"),
    (["--sep", ""], "--sep ''"),
])
def test_a_column_layout_that_contradicts_itself_is_refused(tmp_path, capsys, flags, says):
    data = tmp_path / "t.csv"
    data.write_text("label,i1,c1\n0,1,a\n1,2,b\n")
    out = tmp_path / "prof.json"
    rc, err = _cli(["analyze", str(data), "--format", "csv", "-o", str(out), *flags], capsys)
    _refused(rc, err, says)
    assert not out.exists()


def _spec(tmp_path, edit) -> str:
    import yaml

    from simulator.hardware import PRESET_DIR

    d = yaml.safe_load((PRESET_DIR / "local-cpu.yaml").read_text())
    edit(d)
    path = tmp_path / "hw.json"
    path.write_text(json.dumps(d))
    return str(path)


@pytest.mark.parametrize("edit, says", [
    (lambda d: d.update(nvlink_bw=1e-300), "nvlink_bw: 1e-300 is outside"),
    (lambda d: d.update(pcie_bw=1e300), "pcie_bw: 1e+300 is outside"),
    (lambda d: d["gpu"].update(hbm_bw=1e-3), "gpu.hbm_bw: 0.001 is outside"),
    (lambda d: d["gpu"]["flops"].update(fp32=1e-9), "gpu.flops.fp32"),
    (lambda d: d.update(efficiency={"nic": 1e-30}), "efficiency.nic"),
    (lambda d: d["gpu"].update(streams=1e300), "gpu.streams"),
    (lambda d: d.update(efficiency={"bogus": 1.0}), "efficiency: unknown key 'bogus' (known: compute"),
])
def test_a_hardware_figure_outside_any_machine_is_refused(tmp_path, capsys, edit, says):
    spec = _spec(tmp_path, edit)
    out = tmp_path / "p.json"
    rc, err = _cli(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", spec, "--baseline", "naive",
                    "-o", str(out)], capsys)
    _refused(rc, err, spec, says)
    assert not out.exists()


def test_an_override_outside_any_machine_is_refused(tmp_path, capsys):
    out = tmp_path / "p.json"
    rc, err = _cli(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--baseline", "naive",
                    "--set", "nvlink_bw=1e-300", "-o", str(out)], capsys)
    _refused(rc, err, "nvlink_bw")
    assert not out.exists()
