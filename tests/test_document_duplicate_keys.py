"""A key written twice in one mapping of any document (YAML or JSON) is refused in one line naming
the file and the key: parsers keep the last value silently, while a reader of the file sees the first."""

from __future__ import annotations

import json

import pytest

from foundation.documents import DocumentError, read_json, read_yaml
from picasso.cli import main


def test_yaml_key_twice_names_file_key_and_lines(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("name: m\nnum_dense: 13\ntables: []\nnum_dense: 2\n")
    with pytest.raises(DocumentError, match=r"m\.yaml: model spec has the key 'num_dense' twice .*lines 2 and 4"):
        read_yaml(path, "model spec")


def test_yaml_key_twice_in_a_nested_mapping(tmp_path):
    path = tmp_path / "hw.yaml"
    path.write_text("gpu:\n  hbm_bw: 1e12\n  hbm_bw: 2e12\n")
    with pytest.raises(DocumentError, match="'hbm_bw' twice"):
        read_yaml(path, "hardware spec")


def test_yaml_same_key_in_separate_mappings_and_merges_pass(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("base: &b {dim: 4}\na: {<<: *b, rows: 1}\nb: {<<: *b, rows: 2}\nlist: [{x: 1}, {x: 2}]\n")
    assert read_yaml(path, "spec")["b"] == {"dim": 4, "rows": 2}


def test_json_key_twice_names_file_and_key(tmp_path):
    path = tmp_path / "p.json"
    path.write_text('{"a": 1, "inner": {"k": 1, "k": 2}}')
    with pytest.raises(DocumentError, match=r"p\.json: plan has the key 'k' twice"):
        read_json(path, "plan")
    path.write_text('{"a": [1, {"b": 2}], "c": {"b": 3}}')  # one name in two objects is fine
    assert read_json(path, "plan")["c"] == {"b": 3}


def test_plan_with_a_model_spec_key_twice_is_refused(tmp_path, capsys):
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--print-spec"]) == 0
    spec = capsys.readouterr().out
    assert "\nnum_dense: 13\n" in spec
    path = tmp_path / "m.yaml"
    path.write_text(spec.replace("\nnum_dense: 13\n", "\nnum_dense: 13\nnum_dense: 2\n"))
    out = tmp_path / "p.json"
    rc = main(["plan", "--model", str(path), "--hardware", "local-cpu", "--baseline", "naive", "-o", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(path) in err[0] and "'num_dense' twice" in err[0]
    assert not out.exists()


def test_a_saved_plan_with_a_key_twice_is_refused(tmp_path, capsys):
    plan = tmp_path / "p.json"
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--baseline", "naive",
                 "-o", str(plan)]) == 0
    capsys.readouterr()
    text = plan.read_text()
    doc = json.loads(text)
    key = "batch_size_per_rank"
    assert key in doc
    plan.write_text(text.replace(f'"{key}":', f'"{key}": 1, "{key}":', 1))
    rc = main(["simulate", str(plan)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert str(plan) in err[0] and f"'{key}' twice" in err[0]
