"""Checkpoint faults: a save killed at any stage or on a full disk leaves the previous
checkpoint resumable; --keep; every expected file is required; a crafted file runs no code."""

from __future__ import annotations

import errno
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from executor.comm import Comm
from executor.process.spawn import run_ranks
from executor.run import checkpoint
from executor.run.checkpoint import CheckpointError
from executor.run.reference import dense_state
from executor.run.verify import local_rows, synthetic_global_batches
from executor.step.trainer import Trainer
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan

STAGES = ("start", "shard", "dense", "version")  # before the switch: the old checkpoint stays current


def small_plan(world: int = 1) -> tuple[Plan, dict]:
    tables = (TableSpec("C1", 40, 4), TableSpec("C2", 90, 4))
    m = ModelSpec("faults", "dlrm", 3, tables, bottom_mlp=(8, 4), top_mlp=(8, 1))
    plan = Plan(m, world, 8, [PackPlan("p0", ["C1", "C2"], "row_wise")], hot_rows={"C2": 5},
                hot_ids_file="hot.npz", optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01), seed=1)
    return plan, {"C2": np.arange(5)}


def snapshot(tr: Trainer) -> dict:
    w, s = tr.full_tables()
    return {**w, **{f"state.{k}": v for k, v in s.items()}, **dense_state(tr.dense)}


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def trained(steps: int) -> Trainer:
    plan, hot = small_plan()
    tr = Trainer(plan, hot, Comm())
    for b in synthetic_global_batches(plan, steps, seed=5):
        tr.step(b)
    return tr


def resumed(folder: Path) -> tuple[Trainer, dict]:
    plan, hot = small_plan()
    tr = Trainer(plan, hot, Comm())
    return tr, checkpoint.load(tr, folder)


class Killed(BaseException):
    """Stands for the process dying at a stage: no cleanup code runs after it."""


@pytest.mark.parametrize("stage", STAGES)
def test_a_save_killed_at_any_stage_leaves_the_previous_checkpoint(tmp_path, monkeypatch, stage):
    folder = tmp_path / "ck"
    first = trained(2)
    checkpoint.save(first, folder)
    want = snapshot(first)

    def die(rank: int, name: str) -> None:
        if name == stage:
            raise Killed

    monkeypatch.setattr(checkpoint, "_stage", die)
    with pytest.raises(Killed):
        checkpoint.save(trained(3), folder)
    tr, m = resumed(folder)
    assert m["steps"] == 2 and tr.steps_done == 2
    assert same(snapshot(tr), want)


def test_a_full_disk_during_the_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    folder = tmp_path / "ck"
    first = trained(2)
    checkpoint.save(first, folder)
    want = snapshot(first)
    real = checkpoint.atomic_write_bytes

    def full_disk(path, data):
        if Path(path).name == "dense.pt":
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, data)

    monkeypatch.setattr(checkpoint, "atomic_write_bytes", full_disk)
    with pytest.raises(OSError):
        checkpoint.save(trained(3), folder)
    tr, m = resumed(folder)
    assert m["steps"] == 2 and same(snapshot(tr), want)


def test_keep_k_versions_and_an_older_one_resumes(tmp_path):
    folder = tmp_path / "ck"
    snaps = {}
    for steps in (1, 2, 3):
        tr = trained(steps)
        checkpoint.save(tr, folder, keep=2)
        snaps[steps] = snapshot(tr)
    kept = checkpoint.versions(folder)
    assert [int(v.name.split("-")[1]) for v in kept] == [2, 3]
    assert resumed(folder)[1]["steps"] == 3
    tr, m = resumed(kept[0])  # --resume DIR/step-00000002-...
    assert m["steps"] == 2 and same(snapshot(tr), snaps[2])
    for v in kept:
        assert oct((v / "dense.pt").stat().st_mode & 0o777) == "0o644"


def _rewrite_manifests(folder: Path, edit) -> None:
    """Apply edit(manifest) to the current manifest and its version's copy, as an attacker could."""
    top = json.loads((folder / "manifest.json").read_text())
    for path in (folder / "manifest.json", folder / top["dir"] / "manifest.json"):
        m = json.loads(path.read_text())
        edit(m)
        path.write_text(json.dumps(m))


def test_every_file_the_world_size_implies_is_required_and_checked(tmp_path):
    folder = tmp_path / "ck"
    checkpoint.save(trained(1), folder)
    version = checkpoint.versions(folder)[-1]
    (version / "rank0.pack0.pt").write_bytes(b"damaged")
    _rewrite_manifests(folder, lambda m: m["files"].pop("rank0.pack0.pt"))
    with pytest.raises(CheckpointError, match=r"files: rank0\.pack0\.pt is missing"):
        resumed(folder)
    _rewrite_manifests(folder, lambda m: m.pop("files"))
    with pytest.raises(CheckpointError, match="field files"):
        resumed(folder)
    _rewrite_manifests(folder, lambda m: m.update(files={"../../x": {}}, data_position=float("nan")))
    with pytest.raises(CheckpointError, match="data_position"):
        resumed(folder)


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_crafted_checkpoint_runs_no_code(tmp_path):
    folder = tmp_path / "ck"
    checkpoint.save(trained(1), folder)
    version = checkpoint.versions(folder)[-1]
    marker = tmp_path / "pwned"
    dense = torch.load(version / "dense.pt", weights_only=True)
    dense["steps"] = Payload(marker)
    torch.save(dense, version / "dense.pt")
    data = (version / "dense.pt").read_bytes()

    def fix(m):  # the manifest's hash proves nothing: the attacker fixes it too
        m["files"]["dense.pt"] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}

    _rewrite_manifests(folder, fix)
    with pytest.raises(CheckpointError, match="not a tensor-only"):
        resumed(folder)
    assert not marker.exists()


def _kill_worker(rank: int, world: int, folder: str) -> dict | None:
    plan, hot = small_plan(world)
    tr = Trainer(plan, hot, Comm())
    batches = synthetic_global_batches(plan, 3, seed=5)
    for b in batches[:2]:
        tr.step(local_rows(b, plan, rank))
    checkpoint.save(tr, folder)
    want = snapshot(tr)
    tr.step(local_rows(batches[2], plan, rank))
    os.environ["PICASSO_CKPT_FAULT"] = "1:shard"  # rank 1 dies after writing its shard
    checkpoint.save(tr, folder)
    return want


@pytest.mark.dist
def test_a_rank_killed_during_the_save_leaves_the_previous_checkpoint(tmp_path):
    folder = tmp_path / "ck"
    with pytest.raises(RuntimeError):
        run_ranks(_kill_worker, 2, str(folder), timeout_s=20)
    m = checkpoint.read_manifest(folder)
    assert m["steps"] == 2 and m["world_size"] == 2
    tr, _ = resumed(folder)  # the 2-rank checkpoint loads on one rank
    assert tr.steps_done == 2
    assert len(checkpoint.versions(folder)) == 1  # the killed save's folder is removed, never made current


@pytest.mark.parametrize("cut", ["rows", "columns", "twice", "hot"])
def test_a_piece_whose_tensors_do_not_fit_the_model_is_refused_naming_file_and_table(tmp_path, cut):
    """A piece's weights cut to fewer rows, half its columns, doubled, or a hot cache of another
    width (checksums updated, as an attacker or a broken copy would): one line naming the file and
    the pack's tables, before any of it is used, whether the pack is loaded whole or resharded."""
    folder = tmp_path / "ck"
    checkpoint.save(trained(1), folder)
    version = checkpoint.versions(folder)[-1]
    f = version / "rank0.pack0.pt"
    d = torch.load(f, weights_only=True)
    w = d["pack"]["weight"]
    d["pack"]["weight"] = {"rows": w[:100], "columns": w[:, : w.shape[1] // 2], "twice": torch.cat([w, w]),
                           "hot": w}[cut]
    if cut == "hot":
        d["pack"]["hot_weight"] = d["pack"]["hot_weight"][:, :2]
    _save_as_attacker(folder, f, d)
    with pytest.raises(CheckpointError, match=r"rank0\.pack0\.pt: table 'C1', 'C2': (hot_)?weight is"):
        resumed(folder)
    plan, hot = small_plan()
    plan.packs = [PackPlan("p0", ["C1", "C2"], "table_wise")]  # another sharding: every piece reassembled
    with pytest.raises(CheckpointError, match=r"rank0\.pack0\.pt: table 'C1', 'C2'"):
        checkpoint.load(Trainer(plan, hot, Comm()), folder)


def test_dense_weights_of_another_shape_are_refused_naming_the_weight(tmp_path):
    folder = tmp_path / "ck"
    checkpoint.save(trained(1), folder)
    f = checkpoint.versions(folder)[-1] / "dense.pt"
    d = torch.load(f, weights_only=True)
    name = next(iter(d["dense"]))
    d["dense"][name] = d["dense"][name][:1]
    _save_as_attacker(folder, f, d)
    with pytest.raises(CheckpointError, match=rf"dense\.pt: dense weight '{name}' is 1 x"):
        resumed(folder)


def _save_as_attacker(folder: Path, f: Path, content: dict) -> None:
    """Write `content` to the checkpoint file `f` with its size and checksum updated in the manifests."""
    torch.save(content, f)
    data = f.read_bytes()
    _rewrite_manifests(folder, lambda m: m["files"].update(
        {f.name: {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}}))
