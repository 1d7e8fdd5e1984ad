"""'Top x% covers' counts whole IDs, ceil(x * distinct), wherever a user reads it."""

from __future__ import annotations

import json
import math

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from picasso.cli import main
from traces.coverage import top_ids
from traces.profile import FeatureProfile


@settings(max_examples=200, deadline=None)
@given(counts=st.lists(st.integers(1, 10_000), min_size=1, max_size=300),
       x=st.sampled_from([0.001, 0.01, 0.05, 0.1, 0.25, 0.3, 0.5, 1.0]))  # fmt: skip
def test_top_fraction_covers_whole_ids(counts, x):
    c = np.sort(np.asarray(counts))[::-1]
    f = FeatureProfile(name="f", rows=len(c), missing=0, distinct=len(c), accesses=int(c.sum()),
                       ids=np.arange(len(c)), counts=c)  # fmt: skip
    k = math.ceil(round(x * len(c), 9))
    assert top_ids(x, len(c)) == k >= 1
    # the share of the k hottest IDs, never a fraction of an ID: at least the hottest ID's share
    assert abs(f.coverage(x) - c[:k].sum() / c.sum()) < 1e-12
    assert f.coverage(x) >= c[0] / c.sum() - 1e-12
    assert f.summary()["coverage_top_1pct"] >= c[0] / c.sum() - 1e-12


def test_analyze_table_and_json_show_whole_ids(tmp_path, capsys):
    # A 24-ID field whose hottest ID is 86.7% of accesses: the top 1% is that ID, not 1.7%.
    ids = [0] * 2600 + list(range(1, 24)) * 17 + [1] * 9
    text = "".join(f"{i % 2},{v}\n" for i, v in enumerate(ids))
    p = tmp_path / "d.csv"
    p.write_text("click,site\n" + text)
    assert main(["analyze", str(p), "--format", "csv", "--json"]) == 0
    rec = json.loads(capsys.readouterr().out)[0]
    share = 2600 / len(ids)
    assert rec["distinct"] == 24 and rec["coverage_top_1pct"] == rec["top1_share"] == share
    assert rec["top_ids_0.1pct_1pct_10pct"] == [1, 1, 3]
    assert main(["analyze", str(p), "--format", "csv"]) == 0
    row = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("site"))
    assert row.split()[5] == f"{share:.1%}"  # the top1% column
