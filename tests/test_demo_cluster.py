"""The demo's what-if: a Zipf-heavy log planned for a simulated GPU cluster chooses what the planner
is for: several packs (tables of three widths), hot rows replicated, micro-batches, and a
predicted speedup over each baseline; --explain says why per pack."""

from __future__ import annotations

import validation.demo_cluster as dc


def test_a_skewed_log_on_a_cluster_gets_packs_hot_rows_and_micro_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(dc, "CLUSTERS", dc.CLUSTERS[:1])  # P2RES's cluster: 4 nodes x 8 V100
    _, profile = dc.skewed_log(tmp_path, 50_000, seed=7)
    (cp,) = dc.plan_clusters(tmp_path, profile)
    s = cp.summary()
    assert s["ranks"] == 32 and s["packs"] >= 3 and s["hot_rows"] > 0 and s["micro_batches"] >= 2, s
    assert {t.dim for t in cp.explanation.plan.model.tables} == {32, 64, 128}
    assert s["speedup"]["torchrec-like"] > 1 and s["speedup"]["naive"] > 1
    text = (tmp_path / "cluster-p2res-v100.explain.txt").read_text()
    assert "hot rows, per pack" in text
    reasons = cp.explanation.hot_reasons()
    assert len(reasons) <= 2 * s["packs"] and any(g["hot_rows"] > 0 for g in reasons)
    line = dc.cluster_lines([s])[0]
    assert f"{s['packs']} packs, {s['hot_rows']:,} hot rows replicated" in line and "torchrec-like" in line
