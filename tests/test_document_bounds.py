"""Plans, profiles and dataset manifests come from anyone: what reading one may cost is bounded
(foundation.documents.read_json). Nesting deeper than the parser's stack is one line naming the file
(it escaped as a RecursionError); a file larger than any real one is refused by its size, unread."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation import documents
from planner.plan import Plan
from traces.dataset import Dataset
from traces.profile import AccessProfile


def _load_plan(d):
    return Plan.load(d / "doc.json")


def _load_profile(d):
    return AccessProfile.load(d / "doc.json")


def _load_dataset(d):
    (d / "doc.json").replace(d / "manifest.json")
    return Dataset(d)


LOADERS = {"plan": _load_plan, "profile": _load_profile, "dataset manifest": _load_dataset}


@settings(max_examples=12, deadline=None)
@given(depth=st.integers(20_000, 200_000), opener=st.sampled_from(["[", '{"a":']),
       what=st.sampled_from(sorted(LOADERS)))
def test_deep_nesting_is_one_line(tmp_path_factory, depth, opener, what):
    d = tmp_path_factory.mktemp("deep")
    closer = "]" if opener == "[" else "}"
    (d / "doc.json").write_text(opener * depth + "1" + closer * depth)
    with pytest.raises(ValueError) as e:
        LOADERS[what](d)
    assert "deeper than any real one" in str(e.value) and "\n" not in str(e.value)


@settings(max_examples=12, deadline=None)
@given(extra=st.integers(1, 5000), what=st.sampled_from(sorted(LOADERS)))
def test_a_document_past_the_size_bound_is_refused_unread(tmp_path_factory, extra, what):
    d = tmp_path_factory.mktemp("big")
    limit = 4096
    (d / "doc.json").write_text("{" + " " * (limit + extra) + "}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(documents, "MAX_DOC_BYTES", limit)
        with pytest.raises(ValueError, match=f"more than any real one \\({limit:,} at most\\)"):
            LOADERS[what](d)


def test_simulate_on_a_deeply_nested_plan_is_one_line(tmp_path, capsys):
    from picasso.cli import main

    (tmp_path / "p.json").write_text("[" * 100_000 + "]" * 100_000)
    assert main(["simulate", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "p.json: plan file nests" in err[0], err
