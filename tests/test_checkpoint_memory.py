"""A resume holds one saved pack at a time, and --verify after a resume gathers nothing:
neither may need the whole model on every rank (the shape that killed full-size runs)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import torch

from executor.comm import Comm
from executor.run import checkpoint, verify
from executor.run.reference import Reference, dense_state
from executor.run.verify import synthetic_global_batches
from executor.sparse.embedding import ShardedPack
from executor.step.trainer import Trainer
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan


def three_packs() -> tuple[Plan, dict]:
    tables = (TableSpec("C1", 40, 4), TableSpec("C2", 90, 4), TableSpec("C3", 60, 4), TableSpec("C4", 30, 4))
    m = ModelSpec("ckmem", "dlrm", 3, tables, bottom_mlp=(8, 4), top_mlp=(8, 1))
    packs = [PackPlan("p0", ["C1"], "row_wise"), PackPlan("p1", ["C2", "C3"], "row_wise"),
             PackPlan("p2", ["C4"], "replicated")]
    plan = Plan(m, 1, 8, packs, hot_rows={"C2": 5}, hot_ids_file="hot.npz",
                optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01), seed=1)
    return plan, {"C2": np.arange(5)}


def trained(steps: int) -> Trainer:
    plan, hot = three_packs()
    tr = Trainer(plan, hot, Comm())
    for b in synthetic_global_batches(plan, steps, seed=5):
        tr.step(b)
    return tr


def snapshot(tr: Trainer) -> dict:
    w, s = tr.full_tables()
    return {**w, **{f"state.{k}": v for k, v in s.items()}, **dense_state(tr.dense)}


def _record(monkeypatch) -> list[str]:
    events: list[str] = []
    read = checkpoint._load_tensors
    monkeypatch.setattr(checkpoint, "_load_tensors", lambda p: (events.append(f"read {Path(p).name}"), read(p))[1])
    for method in ("load_full", "load_piece"):
        orig = getattr(ShardedPack, method)
        monkeypatch.setattr(ShardedPack, method, lambda self, *a, _o=orig, _m=method: (
            events.append(f"{_m} {self.layout.name}"), _o(self, *a))[1])
    return events


def test_a_resume_under_the_saving_plan_reads_only_its_own_pieces(tmp_path, monkeypatch):
    tr = trained(2)
    checkpoint.save(tr, tmp_path / "ck")
    events = _record(monkeypatch)
    plan, hot = three_packs()
    back = Trainer(plan, hot, Comm())
    checkpoint.load(back, tmp_path / "ck")
    assert [e for e in events if e != "read dense.pt"] == [
        "read rank0.pack0.pt", "load_piece p0", "read rank0.pack1.pt", "load_piece p1",
        "read rank0.pack2.pt", "load_piece p2"], events
    a, b = snapshot(tr), snapshot(back)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_resharding_load_hands_each_pack_its_shard_before_reading_the_next(tmp_path, monkeypatch):
    tr = trained(2)
    checkpoint.save(tr, tmp_path / "ck")
    events = _record(monkeypatch)
    plan, hot = three_packs()
    plan.packs = [PackPlan("q0", ["C1"], "table_wise"), PackPlan("q1", ["C2", "C3"], "table_wise"),
                  PackPlan("q2", ["C4"], "row_wise")]
    back = Trainer(plan, hot, Comm())
    checkpoint.load(back, tmp_path / "ck")
    assert events.index("load_full q0") < events.index("read rank0.pack1.pt"), events
    assert events.index("load_full q1") < events.index("read rank0.pack2.pt"), events
    a, b = snapshot(tr), snapshot(back)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_resumed_state_equals_the_saved_one(tmp_path):
    tr = trained(3)
    checkpoint.save(tr, tmp_path / "ck")
    plan, hot = three_packs()
    back = Trainer(plan, hot, Comm())
    checkpoint.load(back, tmp_path / "ck")
    a, b = snapshot(tr), snapshot(back)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_checkpoint_of_the_previous_format_still_loads(tmp_path):
    """Format 2 held every pack of a rank in one file `rank{r}.pt`."""
    tr = trained(3)
    folder = tmp_path / "ck"
    version = checkpoint.save(tr, folder)
    packs = [torch.load(version / f"rank0.pack{k}.pt", weights_only=True)["pack"] for k in range(3)]
    for k in range(3):
        (version / f"rank0.pack{k}.pt").unlink()
    buf = io.BytesIO()
    torch.save({"rank": 0, "packs": packs}, buf)
    (version / "rank0.pt").write_bytes(buf.getvalue())
    for path in (folder / "manifest.json", version / "manifest.json"):
        m = json.loads(path.read_text())
        m["format"] = "picasso-checkpoint-2"
        m["files"] = {"rank0.pt": {"bytes": len(buf.getvalue()), "sha256": checkpoint._sha(version / "rank0.pt")},
                      "dense.pt": m["files"]["dense.pt"]}
        path.write_text(json.dumps(m))
    plan, hot = three_packs()
    back = Trainer(plan, hot, Comm())
    checkpoint.load(back, folder)
    a, b = snapshot(tr), snapshot(back)
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_verify_after_a_resume_reads_the_checkpoint_on_rank_0_and_gathers_nothing(tmp_path, monkeypatch):
    tr = trained(3)
    checkpoint.save(tr, tmp_path / "ck")
    plan, hot = three_packs()
    back = Trainer(plan, hot, Comm())
    checkpoint.load(back, tmp_path / "ck")
    saved = tr.full_tables()[0]
    monkeypatch.setattr(Trainer, "full_tables", lambda self: (_ for _ in ()).throw(AssertionError("gathered")))
    ref = verify.start_state(back, str(tmp_path / "ck"))
    assert isinstance(ref, Reference)
    for t in plan.model.tables:  # the reference starts exactly at the saved tables
        assert torch.equal(ref.weight(t.name), saved[t.name])
    batches = synthetic_global_batches(plan, 2, seed=9)
    for b in batches:
        back.step(b)
    out = verify.compare(back, batches, start=ref)
    assert out["max_rel_diff"] < 1e-6 and out["reference_moved"] > 1e-4, out
