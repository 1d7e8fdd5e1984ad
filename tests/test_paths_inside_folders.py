"""A file someone else wrote cannot make picasso read outside that file's own folder: a plan's
hot-ID file and a converted dataset's shards are plain names beside the document."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.fields import FieldError, file_name
from planner.errors import PlanError
from planner.plan import PackPlan, Plan
from planner.presets import get_model

ESCAPES = ["../secret.npz", "/etc/passwd", "a/../../b.npz", "..", ".", "sub/hot.npz", "C:evil.npz", "a\\b.npz"]


@pytest.mark.parametrize("name", ESCAPES)
def test_a_name_that_leaves_its_folder_is_refused_naming_the_field(name):
    with pytest.raises(FieldError, match="field where: .* not a file name in the document's own folder"):
        file_name(name, "where")


@settings(max_examples=80, deadline=None)
@given(st.text(min_size=1, max_size=30))
def test_every_accepted_name_stays_in_the_folder(tmp_path_factory, name):
    base = tmp_path_factory.mktemp("doc").resolve()
    try:
        ok = file_name(name, "f")
    except FieldError:
        return
    assert (base / ok).resolve().parent == base  # one component, inside the folder


def _plan(tmp_path, hot_file: str) -> None:
    m = get_model("dlrm-criteo-kaggle").with_row_cap(100)
    p = Plan(m, 1, 8, [PackPlan("p0", m.table_names, "row_wise")], hot_rows={"C1": 2}, hot_ids_file="hot.npz")
    p.save(tmp_path / "plan.json", hot_ids={"C1": np.arange(2)})
    d = json.loads((tmp_path / "plan.json").read_text())
    d["hot_ids_file"] = hot_file
    (tmp_path / "plan.json").write_text(json.dumps(d))


def test_a_plan_pointing_its_hot_ids_outside_its_folder_is_refused(tmp_path):
    (tmp_path / "outside").mkdir()
    np.savez(tmp_path / "outside" / "hot.npz", C1=np.arange(2))
    sub = tmp_path / "plans"
    sub.mkdir()
    _plan(sub, "../outside/hot.npz")
    with pytest.raises(PlanError, match="hot_ids_file"):
        Plan.load(sub / "plan.json")
    _plan(sub, "plan.hot.npz")
    assert Plan.load(sub / "plan.json").load_hot_ids(sub / "plan.json")["C1"].tolist() == [0, 1]


def test_a_dataset_manifest_pointing_a_shard_outside_is_refused(tmp_path):
    from traces.convert import convert
    from traces.dataset import Dataset
    from traces.errors import TraceError
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "d.tsv", 300, seed=0)
    convert([str(tmp_path / "d.tsv")], "criteo", tmp_path / "ds")
    mf = tmp_path / "ds" / "manifest.json"
    m = json.loads(mf.read_text())
    assert Dataset(tmp_path / "ds").rows == 300
    m["shards"][0]["name"] = "../elsewhere"
    mf.write_text(json.dumps(m))
    with pytest.raises(TraceError, match=r"shards\[0\]\.name"):
        Dataset(tmp_path / "ds")
