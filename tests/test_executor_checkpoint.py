"""Checkpoints: bit-exact resume, resharding to another plan/world size, torn/foreign refused."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch

from executor.comm import Comm
from executor.process.spawn import run_ranks
from executor.run import checkpoint
from executor.run.checkpoint import CheckpointError
from executor.run.reference import dense_state, max_rel_diff
from executor.run.verify import local_rows, synthetic_global_batches
from executor.step.trainer import Trainer
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan

STEPS, SPLIT = 4, 2


def model() -> ModelSpec:
    tables = (TableSpec("C1", 60, 8), TableSpec("C2", 500, 8), TableSpec("C3", 9, 8, pooling_factor=2.0))
    return ModelSpec("ckpt-dlrm", "dlrm", 13, tables, bottom_mlp=(16, 8), top_mlp=(16, 1))


def plan_a(world: int) -> tuple[Plan, dict]:
    plan = Plan(
        model(), world, 16,
        [PackPlan("p0", ["C1", "C3"], "row_wise"), PackPlan("p1", ["C2"], "column_wise")],
        hot_rows={"C2": 40}, hot_ids_file="hot.npz", micro_batches=2,
        optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01, eps=1e-4), seed=3,
    )
    return plan, {"C2": np.arange(40) * 3}


def plan_b() -> tuple[Plan, dict]:
    """Another plan of the same model: other packing, shardings, hot set, one rank."""
    a, _ = plan_a(1)
    plan = replace(a, packs=[PackPlan("q0", ["C1"], "table_wise"), PackPlan("q1", ["C2", "C3"], "replicated")],
                   hot_rows={"C1": 10}, micro_batches=4, world_size=1, batch_size_per_rank=32)
    return plan, {"C1": np.arange(10)}


def snapshot(tr: Trainer) -> dict:
    w, s = tr.full_tables()
    return {**w, **{f"state.{k}": v for k, v in s.items()}, **dense_state(tr.dense)}


def ckpt_worker(rank: int, world: int, folder: str) -> dict | None:
    plan, hot = plan_a(world)
    batches = synthetic_global_batches(plan, STEPS, seed=11)
    cont = Trainer(plan, hot, Comm())
    for b in batches:
        cont.step(local_rows(b, plan, rank))
    want = snapshot(cont)
    first = Trainer(plan, hot, Comm())
    for b in batches[:SPLIT]:
        first.step(local_rows(b, plan, rank))
    checkpoint.save(first, folder)
    resumed = Trainer(plan, hot, Comm())
    manifest = checkpoint.load(resumed, folder)
    for b in batches[manifest["data_position"]:]:
        resumed.step(local_rows(b, plan, rank))
    got = snapshot(resumed)
    if rank:
        return None
    return {"want": want, "exact": all(torch.equal(got[k], want[k]) for k in want), "steps": manifest["steps"]}


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> tuple[Path, dict]:
    folder = tmp_path_factory.mktemp("ckpt") / "c"
    return folder, run_ranks(ckpt_worker, 2, str(folder))[0]


@pytest.mark.dist
def test_resume_is_bit_exact(saved):
    folder, res = saved
    assert res["steps"] == SPLIT
    assert res["exact"]
    [version] = checkpoint.versions(folder)
    assert (folder / "manifest.json").exists() and (version / "rank1.pack0.pt").exists()


@pytest.mark.dist
def test_loads_under_another_plan_and_world_size(saved):
    folder, res = saved
    plan, hot = plan_b()
    tr = Trainer(plan, hot, Comm())
    checkpoint.load(tr, folder)
    for b in synthetic_global_batches(plan_a(2)[0], STEPS, seed=11)[SPLIT:]:
        tr.step(b)
    got = snapshot(tr)
    assert max_rel_diff(got, res["want"]) < 1e-5
    fresh = snapshot(Trainer(plan, hot, Comm()))
    assert max_rel_diff(fresh, res["want"]) > 1e-3  # loading mattered


@pytest.mark.dist
def test_torn_and_foreign_checkpoints_are_refused(saved, tmp_path):
    folder, _ = saved
    plan, hot = plan_b()
    tr = Trainer(plan, hot, Comm())
    torn = tmp_path / "torn"
    shutil.copytree(folder, torn)
    (torn / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="manifest"):
        checkpoint.load(tr, torn)
    cut = tmp_path / "cut"
    shutil.copytree(folder, cut)
    shard = checkpoint.versions(cut)[-1] / "rank1.pack0.pt"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="torn"):
        checkpoint.load(tr, cut)
    other = replace(plan, model=replace(model(), tables=(*model().tables[:2], TableSpec("C3", 10, 8))))
    with pytest.raises(CheckpointError, match="does not match"):
        checkpoint.load(Trainer(other, hot, Comm()), folder)
    with pytest.raises(CheckpointError, match="no such"):
        checkpoint.load(tr, tmp_path / "nothing")
