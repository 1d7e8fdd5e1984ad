"""The systems users compare with: their plans (planner.peers), their engines' traits as lowering
applies them (planner.engines, planner.engine_lowering), the search's peer candidates and
`--explain`'s comparison (planner.peer_compare)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from planner.access import table_access
from planner.builders import baseline_plan
from planner.engines import ENGINE_TRAITS, TRAITS, Engine, Trait
from planner.errors import PlanError
from planner.explain import explain
from planner.lowering import lower
from planner.model_spec import ModelSpec, TableSpec
from planner.peers import PEERS, nvidia_buckets
from planner.plan import Plan
from planner.presets import get_model
from planner.search import evaluate, search
from simulator.hardware import load_hardware


def dlrm(rows: tuple[int, ...] = (40000, 9000, 3000, 800, 500, 60, 9, 7000, 20000, 150)) -> ModelSpec:
    tables = tuple(TableSpec(f"C{i + 1}", n, 16) for i, n in enumerate(rows))
    return ModelSpec("peer-dlrm", "dlrm", 13, tables, bottom_mlp=(64, 16), top_mlp=(64, 1), interaction="dot",
                     dense_dtype="bf16")


def gpus(n: int = 8):
    return load_hardware("dgx-a100", ["nodes=1", f"gpus_per_node={n}"])


def test_nvidia_places_whole_tables_as_its_device_mapping_does():
    sizes = [45, 36, 17, 7, 20, 4, 7, 1, 63, 29, 15, 34, 11, 22, 11, 12, 4, 97, 15, 48, 11, 40, 45, 12, 10, 36]
    buckets = nvidia_buckets(sizes, 7)
    assert sorted(i for b in buckets for i in b) == list(range(26))
    assert max(len(b) for b in buckets) == 4  # at most ceil(26 / 7) tables per device
    plan = baseline_plan("nvidia-dlrm", dlrm(), 8, 64, gpus(), table_access(dlrm()))
    owners = {r for p in plan.packs for r in p.ranks}
    assert 0 not in owners and owners == set(range(1, 8))  # device 0 runs the bottom MLP only
    assert plan.provenance.engine == "nvidia-dlrm" and plan.exchange == "torchrec"


def test_engine_traits_are_named_mechanisms_with_sources():
    for engine, traits in ENGINE_TRAITS.items():
        for t in traits:
            assert TRAITS[t].source and TRAITS[t].mechanism, (engine, t)
    with pytest.raises(PlanError, match="engine"):
        Plan.from_dict({**baseline_plan("naive", dlrm(), 2, 16).to_dict(), "provenance": {"engine": "tensorflow"}})


def test_nvidia_engine_runs_the_bottom_mlp_on_rank_0_for_every_rank():
    m, hw = dlrm(), gpus()
    plan = baseline_plan("nvidia-dlrm", m, 8, 64, hw, table_access(m))
    ours = replace(plan, provenance=replace(plan.provenance, engine=None))
    theirs, mine = (lower(p, hw, symmetric=False).op("fwd/dense/bottom_mlp") for p in (plan, ours))
    assert list(theirs.ranks) == [0] and mine.ranks is None
    assert theirs.demand["flops"] == pytest.approx(8 * mine.demand["flops"])


def test_fused_interaction_and_pooling_remove_their_round_trips():
    m, hw = dlrm(), gpus()
    acc = table_access(m)
    plan = baseline_plan("hugectr", m, 8, 64, hw, acc)
    ours = replace(plan, provenance=replace(plan.provenance, engine=None))
    a, b = lower(plan, hw, access=acc), lower(ours, hw, access=acc)
    assert a.op("fwd/dense/interaction").demand["hbm_bytes"] < 0.5 * b.op("fwd/dense/interaction").demand["hbm_bytes"]
    pool = next(pv for pv in a.packs)
    cut = pool.samples * pool.pooled_width * 4
    assert b.op(f"fwd/{pool.name}/pool").demand["hbm_bytes"] - a.op(f"fwd/{pool.name}/pool").demand["hbm_bytes"] \
        == pytest.approx(cut)
    # 16-bit exchange: the rows' all-to-all carries half the bytes under bf16
    ca, cb = a.op(f"fwd/{pool.name}/a2a_emb").collective[1], b.op(f"fwd/{pool.name}/a2a_emb").collective[1]
    assert np.max(ca) == pytest.approx(0.5 * np.max(cb))


def test_hybrid_embedding_replicates_frequent_rows_of_one_hot_tables_only():
    m = dlrm()
    multi = replace(m, tables=(replace(m.tables[0], pooling_factor=20.0, max_len=64),) + m.tables[1:])
    hw = gpus()
    one_hot = baseline_plan("hugectr", m, 8, 512, hw, table_access(m))
    assert one_hot.hot_rows and all(0 < n <= m.table(t).num_rows for t, n in one_hot.hot_rows.items())
    mixed = baseline_plan("hugectr", multi, 8, 512, hw, table_access(multi))
    assert "C1" not in mixed.hot_rows and mixed.hot_rows


def test_the_search_never_returns_a_plan_slower_than_a_peers_plan():
    m, hw = dlrm(), gpus()
    acc = table_access(m)
    res = search(m, hw, None, 256, access=acc, time_budget_s=3.0)
    assert any(e.label.startswith("peer:") for e in res.candidates)
    for name in PEERS:
        peer = baseline_plan(name, m, 8, 256, hw, acc)
        peer.provenance.engine = None  # its plan, on picasso's engine
        ev = evaluate(peer, hw, acc, "simpy", None, name)
        assert res.best.iteration_us <= ev.iteration_us * (1 + 1e-9), name


def test_explain_compares_each_peer_on_its_engine_and_on_picassos():
    m, hw = dlrm(), gpus()
    acc = table_access(m)
    plan = search(m, hw, None, 256, access=acc, time_budget_s=2.0).plan
    ex = explain(plan, hw, access=acc, baselines=(), peers=PEERS)
    rows = {d["peer"]: d for d in ex.to_dict()["peers"]}
    assert set(rows) == set(PEERS)
    for d in rows.values():
        assert d["own_engine_us"] > 0 and d["picasso_engine_us"] >= ex.evaluation.iteration_us * (1 - 1e-9)
        assert d["traits"] and d["plan"]
    text = ex.text()
    assert "against the systems users compare with" in text and "plan: " in text and "engine: " in text
    assert Trait.BOTTOM_MLP_ON_ONE_RANK.value in text


def test_hugectr_baseline_from_the_command_line_writes_its_frequent_rows(tmp_path, capsys):
    from picasso.cli import main

    out = tmp_path / "h.json"
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "dgx-a100", "--batch-size", "2048",
                 "--baseline", "hugectr", "-o", str(out)]) == 0
    capsys.readouterr()
    plan = Plan.load(out)
    assert plan.provenance.engine == Engine.HUGECTR and plan.hot_rows
    assert {t: len(v) for t, v in plan.load_hot_ids().items()} == plan.hot_rows
    assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "dgx-a100", "--baseline", "hugectr2",
                 "-o", str(tmp_path / "x.json")]) == 2
    assert "nvidia-dlrm" in capsys.readouterr().err


def test_adam_tables_are_accepted_and_cost_their_two_moments():
    m = get_model("dlrm-criteo-kaggle")
    adam = replace(m, tables=tuple(replace(t, optimizer="adam") for t in m.tables))
    assert ModelSpec.from_dict(adam.to_dict()).tables[0].optimizer == "adam"
    assert adam.tables[0].state_bytes == 2 * 4 * adam.tables[0].dim
    hw = gpus(2)
    plans = [baseline_plan("naive", x, 2, 1024) for x in (m, adam)]
    sgd_l, adam_l = (lower(p, hw) for p in plans)
    assert adam_l.memory.hbm_total.sum() - sgd_l.memory.hbm_total.sum() >= sum(t.num_rows for t in m.tables) * 8 * m.tables[0].dim * 0.99
    upd = "opt/t_C1/cold_update"
    assert np.max(adam_l.op(upd).demand["hbm_bytes"]) > np.max(sgd_l.op(upd).demand["hbm_bytes"])
    # the executor updates Adam's rows with torch ops, not one fused kernel: more launches
    assert adam_l.op(upd).args["launch"] > sgd_l.op(upd).args["launch"]
