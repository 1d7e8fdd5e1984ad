"""A number in a file someone else wrote is only a number: a small file that declares huge counts
(array lengths, inflated sizes) is one line naming the file, not a MemoryError or a hang."""

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
