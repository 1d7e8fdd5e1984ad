"""`picasso run` finds bad inputs before any rank starts: a missing --resume folder, a glob file
of another layout, a converted dataset whose manifest lists a shard twice or whose shard leads out
of its folder, and `.npy` columns whose header (dtype, byte order, shape) is not what convert writes."""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import replace

import numpy as np
import pytest

from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from tests.cli_lines import refused
from traces.dataset import Dataset
from traces.errors import TraceError


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("upfront")
    generate_criteo(d / "a.tsv", 300, seed=0)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(300), bottom_mlp=(16, 16), top_mlp=(8, 1))
    Plan(m, 2, 16, [PackPlan("pack0", m.table_names, "row_wise")]).save(d / "plan.json")
    assert main(["convert", str(d / "a.tsv"), "--format", "criteo", "-o", str(d / "ds"), "--shard-rows", "100"]) == 0
    return d


@pytest.fixture
def no_ranks(monkeypatch):
    """Any rank start fails the test: each refusal must come from the command's own checks."""
    import executor.process.launch as launch

    def started(*a, **k):
        raise AssertionError("the ranks were started")

    monkeypatch.setattr(launch, "launch", started)


def test_a_missing_resume_folder_is_found_before_the_ranks_start(setup, capsys, no_ranks, tmp_path):
    refused(capsys, ["run", setup / "plan.json", "--data", setup / "a.tsv", "--steps", "1",
                      "--resume", tmp_path / "nowhere"], "no such checkpoint folder")


def test_every_file_of_a_glob_is_checked_before_the_ranks_start(setup, capsys, no_ranks, tmp_path):
    shutil.copy(setup / "a.tsv", tmp_path / "day_0.tsv")
    lines = (setup / "a.tsv").read_text().splitlines()
    (tmp_path / "day_1.tsv").write_text("".join("\t".join(ln.split("\t")[:13] + ln.split("\t")[14:]) + "\n"
                                                for ln in lines))  # 12 dense columns
    refused(capsys, ["run", setup / "plan.json", "--data", tmp_path / "day_*.tsv", "--steps", "1"], "day_1.tsv")


def _copy(setup, tmp_path):
    ds = tmp_path / "ds"
    shutil.copytree(setup / "ds", ds)
    return ds


def test_a_shard_listed_twice_isrefused(setup, capsys, no_ranks, tmp_path):
    ds = _copy(setup, tmp_path)
    m = json.loads((ds / "manifest.json").read_text())
    m["shards"] = [m["shards"][0]] * 3
    m["rows"] = 3 * m["shards"][0]["rows"]
    (ds / "manifest.json").write_text(json.dumps(m))
    refused(capsys, ["run", setup / "plan.json", "--data", ds, "--steps", "1"], "listed more than once")


def test_a_shard_linked_out_of_the_dataset_isrefused(setup, capsys, no_ranks, tmp_path):
    ds = _copy(setup, tmp_path)
    outside = tmp_path / "elsewhere"
    shutil.move(ds / "shard-00001", outside)
    os.symlink(outside, ds / "shard-00001")
    refused(capsys, ["run", setup / "plan.json", "--data", ds, "--steps", "1"], "leads out of the dataset folder")


@pytest.mark.parametrize("column,dtype", [("dense", ">f4"), ("ids", "<i4"), ("dense", "<f8"), ("labels", ">f4")])
def test_a_column_of_another_dtype_is_one_line_naming_it(setup, capsys, no_ranks, tmp_path, column, dtype):
    ds = _copy(setup, tmp_path)
    f = ds / "shard-00002" / f"{column}.npy"
    np.save(f, np.load(f).astype(dtype))  # same values, shape and rows: only the header's dtype differs
    with pytest.raises(TraceError, match=rf"{column}\.npy: holds .*\({np.dtype(dtype).str}\), the dataset format"):
        Dataset(ds)
    refused(capsys, ["run", setup / "plan.json", "--data", ds, "--steps", "1"], f"{column}.npy: holds")


@pytest.mark.parametrize("edit", ["fewer_ids", "more_accesses", "unsorted", "stability"])
def test_profile_arrays_that_contradict_their_summary_are_one_line(setup, tmp_path, edit):
    """A profile's arrays agree with its JSON summary: the IDs and accesses it counts, hottest
    first, one stability record per fraction (a profile's .npz swapped or edited is refused)."""
    from traces.profile import AccessProfile, profile_file

    prof = profile_file(str(setup / "a.tsv"), "criteo")
    prof.save(tmp_path / "p.json")
    z = dict(np.load(tmp_path / "p.npz"))
    doc = json.loads((tmp_path / "p.json").read_text())
    i = next(k for k, d in enumerate(doc["features"]) if d["exact"] and d["distinct"] > 2)
    if edit == "fewer_ids":
        z[f"f{i}_ids"], z[f"f{i}_counts"] = z[f"f{i}_ids"][:-1], z[f"f{i}_counts"][:-1]
    elif edit == "more_accesses":
        z[f"f{i}_counts"] = z[f"f{i}_counts"] * 2
    elif edit == "unsorted":
        z[f"f{i}_counts"] = z[f"f{i}_counts"][::-1].copy()
    else:
        z[f"f{i}_stability_sizes"] = np.concatenate([z[f"f{i}_stability_sizes"], [1]])
    np.savez(tmp_path / "p.npz", **z)
    with pytest.raises(TraceError, match=rf"p\.npz: arrays features\[{i}\]\."):
        AccessProfile.load(tmp_path / "p.json")
