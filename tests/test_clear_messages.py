"""Inputs that used to reach users as a Python error or an anonymous decode error: one line
naming the file or the field."""

from __future__ import annotations

import pytest

from picasso.cli import main


@pytest.mark.parametrize("command", [["plan", "--model", "dlrm-criteo-kaggle", "-o", "{tmp}/plan.json"],
                                     ["simulate", "{tmp}/plan.json"]])
def test_a_huge_cluster_override_is_one_line(tmp_path, capsys, command):
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--baseline", "naive",
                 "-o", str(tmp_path / "plan.json")]) == 0
    capsys.readouterr()
    args = [a.format(tmp=tmp_path) for a in command]
    rc = main([*args, "--hardware", "local-cpu", "--set", "nodes=1e18"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "nodes x gpus_per_node" in err[0] and "internal" not in err[0], err


@pytest.mark.parametrize("flag,what", [("--hardware", "hardware spec"), ("--model", "model-spec file")])
def test_a_spec_that_is_not_utf8_names_its_file(tmp_path, capsys, flag, what):
    bad = tmp_path / "spec.yaml"
    bad.write_bytes(b"name: x\ngpu: [\xff\xfe]\n")
    args = {"--hardware": "local-cpu", "--model": "dlrm-criteo-kaggle", flag: str(bad)}
    rc = main(["plan", "--model", args["--model"], "--hardware", args["--hardware"], "-o", str(tmp_path / "p.json")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(bad) in err[0] and f"{what} is not UTF-8 text" in err[0], err


@pytest.mark.parametrize("command", ["analyze", "convert"])
def test_a_parquet_file_with_a_repeated_column_names_the_file(tmp_path, capsys, command):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "dup.parquet"
    cols = [pa.array([1, 0, 1])] + [pa.array(["a", "b", "c"])] * 5
    pq.write_table(pa.Table.from_arrays(cols, names=["label", *["0"] * 5]), path)
    rc = main([command, str(path), "--format", "parquet", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and str(path) in err[0] and "'0' appears 5 times" in err[0], err
