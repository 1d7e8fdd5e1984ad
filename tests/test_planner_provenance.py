"""`picasso plan` plans from the data it is given or says it does not: profile/model mismatch,
per-table provenance and hot-set reasons, replicated packs, baseline synchronisation, --print-spec."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from picasso.cli import main
from planner.inputs import load_inputs
from planner.model_spec import ModelSpec
from planner.presets import PRESETS, get_model
from traces.profile import profile_file
from traces.synth import generate_criteo

CPU = ["--hardware", "local-cpu", "--set", "nodes=1", "--set", "gpus_per_node=2"]


@pytest.fixture(scope="module")
def criteo_profile(tmp_path_factory):
    d = tmp_path_factory.mktemp("prof")
    generate_criteo(d / "d.tsv", 4000, seed=2)
    profile_file(d / "d.tsv", "criteo", batch_size=256).save(d / "p.json")
    return d / "p.json"


@pytest.fixture(scope="module")
def other_profile(tmp_path_factory):
    """A profile of a different data set (Avazu-like names; C1 and C14 collide with Criteo's)."""
    d = tmp_path_factory.mktemp("other")
    rng = np.random.default_rng(0)
    rows = "".join(f"{i},{i % 2},{rng.integers(0, 30)},{rng.integers(0, 9)},{rng.integers(0, 500)}\n" for i in range(800))
    (d / "a.csv").write_text("id,click,C1,C14,site_id\n" + rows)
    profile_file(d / "a.csv", "avazu").save(d / "a.json")
    return d / "a.json"


def plan_cli(*args):
    return subprocess.run([sys.executable, "-m", "picasso", "plan", *args], capture_output=True, text=True)


def test_profile_of_other_data_is_refused_naming_tables(other_profile, tmp_path):
    r = plan_cli("--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "500", "--profile", str(other_profile),
                 "-o", str(tmp_path / "p.json"), "--time-budget", "2")
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert "no feature for 24 of 26 tables of dlrm-criteo-kaggle" in r.stderr and "(C2, C3, C4, " in r.stderr
    assert "the profile has C1, C14, site_id" in r.stderr
    assert "--assume-zipf" in r.stderr and not (tmp_path / "p.json").exists()


def test_assume_zipf_opt_in_and_sources_per_table(other_profile, criteo_profile, tmp_path, capsys):
    argv = ["plan", "--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "500", "--batch-size", "64",
            "-o", str(tmp_path / "p.json"), "--time-budget", "2", "--json"]
    assert main([*argv, "--profile", str(other_profile), "--assume-zipf"]) == 0
    out = capsys.readouterr()
    src = {t["table"]: t["source"] for t in json.loads(out.out)["tables"]}
    assert src["C1"].startswith("measured: feature 'C1'") and src["C14"].startswith("measured")
    assert src["C2"].startswith("assumed zipf(1.05)") and "has no feature 'C2'" in src["C2"]
    assert "24 table(s) planned from an assumed Zipf(1.05)" in out.err
    assert main([*argv, "--profile", str(criteo_profile)]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(t["source"].startswith("measured") for t in d["tables"]) and len(d["tables"]) == 26
    assert main(argv) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(t["source"] == "assumed zipf(1.05): no profile given" for t in d["tables"])


def test_explain_says_why_each_hot_set_has_its_size(criteo_profile, tmp_path, capsys):
    argv = ["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "p2res-v100", "--profile", str(criteo_profile),
            "-o", str(tmp_path / "p.json"), "--time-budget", "3"]
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    for t in d["tables"]:
        assert t["why"] and t["hot_row_cost_bytes"] == 64 and t["top_row_share"] > 0
        assert t["scale_kept"] is not None
        if t["hot_rows"]:
            assert t["closed_form_rows"] > 0 and t["threshold_share"] > 0
    assert main([*argv, "--explain"]) == 0
    text = capsys.readouterr().out
    assert "hot rows, per pack" in text and "access statistics: measured: " in text


def test_explain_says_why_per_pack_not_per_table(criteo_profile, tmp_path, capsys):
    """26 tables in one replicated pack: one reason, not the same sentence 26 times; the
    statistics' source once, not per table; per table the reasons stay in --json."""
    argv = ["plan", "--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "2000", "--batch-size", "64",
            "--profile", str(criteo_profile), "-o", str(tmp_path / "p.json"), "--time-budget", "2"]
    assert main([*argv, "--explain"]) == 0
    text = capsys.readouterr().out
    packs = [x.split()[0] for x in text.splitlines() if x.startswith(("pack", "g0"))]
    assert text.count("replicated pack: every row is local") == 1, text
    assert text.count("access statistics: measured: criteo") <= 1 and "(all 26 tables)" in text, text
    reasons = [x for x in text.splitlines() if "replicated pack: every row is local" in x]
    assert reasons and reasons[0].split()[0] in packs
    assert main([*argv, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["tables"]) == 26 and all(t["reason"] == "replicated_pack" for t in d["tables"])
    assert [g["tables"] for g in d["hot_reasons"]] == [[t["table"] for t in d["tables"]]]


def test_replicated_pack_is_not_hot_cover_zero_and_baselines_say_how_they_sync(tmp_path, capsys):
    assert main(["plan", "--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "200", "--batch-size", "64",
                 "--baseline", "dp-hot-only", "-o", str(tmp_path / "b.json"), "--explain"]) == 0
    text = capsys.readouterr().out
    rows = [x for x in text.splitlines() if x.startswith("g0_dp")]
    assert rows and "0.0%" not in rows[0] and "all (replicated)" in rows[0] and "all-gather" in rows[0]
    assert "dp-hot-only" in text and "all-gathers the sparse gradients" in text
    assert main(["plan", "--model", "dlrm-criteo-kaggle", *CPU, "--row-cap", "200", "--batch-size", "64",
                 "--baseline", "dp-hot-only", "-o", str(tmp_path / "b.json"), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert all(p["hot_coverage"] == 1.0 for p in d["packs"] if p["sharding"] == "replicated")
    assert set(d["baseline_sync"]) == {"naive", "torchrec-like", "dp-hot-only"}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_print_spec_reads_back_as_the_same_model(name, tmp_path, capsys):
    assert main(["plan", "--model", name, "--print-spec"]) == 0
    text = capsys.readouterr().out
    (tmp_path / "m.yaml").write_text(text)
    assert get_model(str(tmp_path / "m.yaml")) == get_model(name)
    assert isinstance(yaml.safe_load(text), dict)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.sampled_from([10**6, 45_840_617, 10**9]))
def test_planning_scale_caps_each_table_at_num_rows(criteo_profile, rows):
    model, _, profile, _ = load_inputs("dlrm-criteo-kaggle", "dgx-h100", [], str(criteo_profile), rows, None)
    for t in model.tables:
        assert profile.features[t.name].distinct <= t.num_rows, t.name


def test_model_spec_documented_in_the_guide(tmp_path):
    from pathlib import Path

    guide = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    section = guide.split("## Model specs", 1)[1]
    assert "--print-spec" in section
    (tmp_path / "m.yaml").write_text(section.split("```yaml", 1)[1].split("```", 1)[0])
    model = get_model(str(tmp_path / "m.yaml"))  # the documented example is a complete, valid spec
    assert isinstance(model, ModelSpec) and len(model.tables) >= 2
