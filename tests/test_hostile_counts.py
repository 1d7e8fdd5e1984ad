"""A number in a file someone else wrote is only a number: a small file that declares huge counts
(array lengths, inflated sizes, ranks times packs, rows, tables) or an infinite quantity is one line
naming the file, not a MemoryError, a hang or a message the size of the count."""

from __future__ import annotations

import io
import json
import time
import zipfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

FEW = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _npy_header(shape: tuple[int, ...], descr: str = "<i8") -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(buf, {"descr": descr, "fortran_order": False, "shape": shape})
    return buf.getvalue()


def _hostile_npz(path: Path, member: str, attack: str, size: int) -> None:
    """An .npz whose `member` promises more than it holds ('shape'), or deflates to `size` MiB ('inflate')."""
    if attack == "shape":
        with zipfile.ZipFile(path, "w") as z:
            z.writestr(f"{member}.npy", _npy_header((1 << size,)) + bytes(64))
    else:
        n = (size << 20) // 8
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
            z.writestr(f"{member}.npy", _npy_header((n,)) + bytes(n * 8))


def _load_hot_ids(d: Path, attack: str, size: int) -> tuple[Path, Exception]:
    from planner.errors import PlanError
    from planner.plan import read_hot_ids

    _hostile_npz(d / "hot.npz", "C1", attack, size)
    with pytest.raises(PlanError) as e:
        read_hot_ids(d / "hot.npz")
    return d / "hot.npz", e.value


def _load_profile(d: Path, attack: str, size: int) -> tuple[Path, Exception]:
    from traces.errors import TraceError
    from traces.profile import AccessProfile, FeatureProfile

    f = FeatureProfile("C1", rows=10, missing=0, distinct=3, accesses=10, ids=np.array([5, 6, 7]),
                       counts=np.array([5, 3, 2]))
    AccessProfile({"C1": f}, rows=10, source="t").save(d / "profile.json")
    _hostile_npz(d / "profile.npz", "f0_ids", attack, size)
    with pytest.raises(TraceError) as e:
        AccessProfile.load(d / "profile.json")
    return d / "profile.npz", e.value


@FEW
@given(reader=st.sampled_from([_load_hot_ids, _load_profile]),
       attack_size=st.one_of(st.tuples(st.just("shape"), st.integers(20, 60)),
                             st.tuples(st.just("inflate"), st.integers(17, 48))))
def test_an_archive_costs_no_more_than_its_bytes(tmp_path_factory, reader, attack_size):
    """A member's header cannot promise more elements than it holds, and members cannot inflate
    far past the file's own size (foundation.npz)."""
    attack, size = attack_size
    t0 = time.perf_counter()
    path, err = reader(tmp_path_factory.mktemp("npz"), attack, size)
    assert time.perf_counter() - t0 < 5.0
    msg = str(err)
    assert "\n" not in msg and str(path) in msg and ("promises" in msg or "inflate" in msg), msg


@settings(max_examples=10, deadline=None)
@given(world=st.integers(1 << 10, 1 << 16), packs=st.integers(64, 4096))
def test_ranks_times_packs_is_checked_before_any_name_is_listed(tmp_path_factory, world, packs):
    from executor.run.checkpoint import CheckpointError, read_manifest

    d = tmp_path_factory.mktemp("ck")
    (d / "manifest.json").write_text(json.dumps({
        "format": "picasso-checkpoint-3", "model": "m", "model_fingerprint": "f", "world_size": world, "steps": 0,
        "data_position": 0, "packs": [["p", ["t"], "row_wise"]] * packs, "files": {"dense.pt": {}}}))
    t0 = time.perf_counter()
    with pytest.raises(CheckpointError) as e:
        read_manifest(d)
    assert time.perf_counter() - t0 < 2.0
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 400 and "is missing" in msg and str(d) in msg, msg[:400]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    from traces.convert import convert
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("ds")
    generate_criteo(d / "d.tsv", 200, seed=0)
    convert([str(d / "d.tsv")], "criteo", d / "ds", shard_rows=64)
    return d / "ds"


JSON_VALUES = st.recursive(st.none() | st.booleans() | st.integers(-(1 << 70), 1 << 70) | st.floats() | st.text(max_size=8),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                                       max_size=3), max_leaves=6)
MANIFEST_FIELDS = ["features", "dense", "dense_transform", "rows", "shards", "malformed_rows", "shards.0",
                   "shards.0.rows", "shards.0.name", "features.0"]


@settings(max_examples=40, deadline=None)
@given(field=st.sampled_from(MANIFEST_FIELDS), value=JSON_VALUES | st.just("__missing__"))
def test_a_mutated_dataset_manifest_opens_or_is_one_line(dataset, tmp_path_factory, field, value):
    import shutil

    from traces.dataset import Dataset
    from traces.errors import TraceError

    d = tmp_path_factory.mktemp("mut") / "ds"
    shutil.copytree(dataset, d)
    m = json.loads((d / "manifest.json").read_text())
    *parents, leaf = field.split(".")
    node = m
    for p in parents:
        node = node[int(p)] if isinstance(node, list) else node[p]
    key = int(leaf) if isinstance(node, list) else leaf
    if value == "__missing__":
        del node[key]
    else:
        node[key] = value
    (d / "manifest.json").write_text(json.dumps(m))
    try:
        ds = Dataset(d)
        ds.read_range(0, ds.rows)
    except TraceError as e:
        assert "\n" not in str(e) and str(d) in str(e), e


@settings(max_examples=10, deadline=None)
@given(extra=st.integers(1, (1 << 48) - 200))
def test_a_shard_row_count_its_bytes_cannot_hold_is_refused_on_opening(dataset, tmp_path_factory, extra):
    import shutil

    from traces.dataset import Dataset
    from traces.errors import TraceError

    d = tmp_path_factory.mktemp("rows") / "ds"
    shutil.copytree(dataset, d)
    m = json.loads((d / "manifest.json").read_text())
    m["shards"][-1]["rows"] += extra
    m["rows"] += extra
    (d / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(TraceError) as e:
        ds = Dataset(d)  # a count its bytes cannot hold: refused before anything is read
        assert extra <= 64, "opened a dataset whose labels cannot hold its rows"
        ds.read_range(0, ds.rows)  # a lie within the .npy header's size shows when the shard opens
    assert "\n" not in str(e.value) and str(d) in str(e.value), e.value


def test_a_model_of_more_tables_than_any_real_one_is_one_line(tmp_path):
    from planner.errors import PlanError
    from planner.model_spec import MAX_TABLES
    from planner.presets import get_model

    spec = {"name": "wide", "arch": "dlrm", "num_dense": 4, "bottom_mlp": [8], "top_mlp": [8, 1],
            "tables": [{"name": f"t{i}", "num_rows": 10, "dim": 8} for i in range(MAX_TABLES + 1)]}
    (tmp_path / "wide.json").write_text(json.dumps(spec))
    with pytest.raises(PlanError, match="more than any real model") as e:
        get_model(str(tmp_path / "wide.json"))
    assert str(tmp_path / "wide.json") in str(e.value)


@settings(max_examples=12, deadline=None)
@given(key=st.sampled_from(["gpu.hbm_bytes", "gpu.hbm_bw", "pcie_bw", "gpu.streams", "nodes", "host.dram_bytes"]),
       value=st.sampled_from([".inf", "-.inf", ".nan", "1e400", "9" * 400]), via=st.sampled_from(["file", "--set"]))
def test_an_infinite_quantity_is_one_line(tmp_path_factory, key, value, via):
    import yaml

    from simulator.hardware import HardwareError, load_hardware

    d = tmp_path_factory.mktemp("hw")
    hw = load_hardware("local-cpu").to_dict()
    if via == "file":
        node = hw
        *parents, leaf = key.split(".")
        for p in parents:
            node = node[p]
        node[leaf] = 0  # replaced by the YAML text below, unquoted: YAML reads .inf as a float
        text = yaml.safe_dump(hw, sort_keys=False).replace(f"{leaf}: 0\n", f"{leaf}: {value}\n", 1)
        (d / "hw.yaml").write_text(text)
        load = lambda: load_hardware(str(d / "hw.yaml"))  # noqa: E731
    else:
        load = lambda: load_hardware("local-cpu", [f"{key}={value.lstrip('.')}"])  # noqa: E731
    with pytest.raises(HardwareError) as e:
        load()
    assert "\n" not in str(e.value) and len(str(e.value)) < 300, str(e.value)[:300]


def test_a_profile_cannot_name_arrays_outside_its_folder(tmp_path):
    from traces.errors import TraceError
    from traces.profile import AccessProfile, FeatureProfile

    f = FeatureProfile("C1", rows=10, missing=0, distinct=3, accesses=10, ids=np.array([5, 6, 7]),
                       counts=np.array([5, 3, 2]))
    (tmp_path / "in").mkdir()
    AccessProfile({"C1": f}, rows=10, source="t").save(tmp_path / "in" / "profile.json")
    (tmp_path / "in" / "profile.npz").replace(tmp_path / "elsewhere.npz")
    doc = json.loads((tmp_path / "in" / "profile.json").read_text())
    (tmp_path / "in" / "profile.json").write_text(json.dumps({**doc, "arrays": "../elsewhere.npz"}))
    with pytest.raises(TraceError, match="field arrays"):
        AccessProfile.load(tmp_path / "in" / "profile.json")
