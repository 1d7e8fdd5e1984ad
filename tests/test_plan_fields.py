"""No plan field is silently ignored by the executor.

The test walks every field of the Plan schema (Plan, PackPlan, OptimizerPlan, and the
model's TableSpec). A field is either listed as planning-only, with its reason, in
executor.run.plan_fields, or it has a change below under which a 2-rank run, loaded from disk
as `picasso run` loads it, differs from the base run: in its weights, its ranks' state
(rows held, hot rows, storage dtype), its timeline (op names, lanes, order), or by refusing
to start. A new field without either fails `test_every_field_is_run_or_listed`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from executor.run.plan_fields import PLANNING_ONLY
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from tests.shared_ranks import shared_call

WORLD = 2
SCHEMA = {"Plan": Plan, "PackPlan": PackPlan, "OptimizerPlan": OptimizerPlan, "TableSpec": TableSpec}
HOT = {"C2": np.arange(30) * 7 % 300, "C3": np.arange(100) * 3}
OTHER_HOT = {"C2": np.arange(30) * 5 % 300 + 1, "C3": np.arange(100) * 2 + 1}


def dlrm() -> ModelSpec:
    tables = [TableSpec(f"C{i + 1}", n, 8) for i, n in enumerate([40, 300, 1000, 7])]
    tables.append(TableSpec("C5", 120, 8, pooling_factor=3.0))
    return ModelSpec("tiny-dlrm", "dlrm", 13, tuple(tables), bottom_mlp=(16, 8), top_mlp=(16, 1))


def din() -> ModelSpec:
    t = lambda n, r, **kw: TableSpec(n, r, 8, **kw)  # noqa: E731
    return ModelSpec("tiny-din", "din", 0, (t("user", 80), t("item", 500), t("hist", 500, pooling="none", max_len=6)),
                     top_mlp=(16, 1), extra={"attention_mlp": [8], "query": {"hist": "item"}})


def base(model: ModelSpec | None = None) -> dict:
    """Every sharding, hot rows, one micro-batch, no interleaving; sgd tables, adam dense."""
    if model is not None:  # DIN: one row-wise pack per table
        packs = [PackPlan(t.name, [t.name]) for t in model.tables]
        return Plan(model, WORLD, 16, packs, optimizer=OptimizerPlan("sgd", 0.5, "adam", 0.01)).to_dict()
    packs = [PackPlan("a", ["C1", "C2"], "row_wise"), PackPlan("b", ["C3"], "column_wise"),
             PackPlan("c", ["C4"], "replicated"), PackPlan("d", ["C5"], "table_wise", ranks=[1])]
    plan = Plan(dlrm(), WORLD, 16, packs, hot_rows={"C2": 30, "C3": 100}, hot_ids_file="hot.npz",
                optimizer=OptimizerPlan("sgd", 0.5, "adam", 0.01, eps=1e-4))
    return plan.to_dict()


def with_table(d: dict, table: str, **kw) -> dict:
    d = json.loads(json.dumps(d))
    for t in d["model"]["tables"]:
        if t["name"] == table:
            t.update(kw)
    return d


def changed(d: dict, path: str, value) -> dict:
    """`d` with one value replaced: path like "packs.0.placement" or "optimizer.eps"."""
    d = json.loads(json.dumps(d))
    *head, last = path.split(".")
    node = d
    for k in head:
        node = node[int(k)] if isinstance(node, list) else node[k]
    node[int(last) if isinstance(node, list) else last] = value
    return d


def renamed_table(d: dict) -> dict:
    d = with_table(d, "C1", name="X1")
    d["packs"][0]["tables"][0] = "X1"
    return d


# field -> (base plan, changed plan, hot-ID file of the changed plan's run)
B = base()
PIPED = changed(changed(B, "micro_batches", 2), "input_pipeline", True)
K2 = changed(B, "micro_batches", 2)
# two table-wise packs next to each other, pooled at their owners: a run TorchRec fuses
TW = {**B, "packs": [B["packs"][0], B["packs"][2],
                     {"name": "b", "tables": ["C3"], "sharding": "table_wise", "ranks": [0], "exchange": "pooled"},
                     {**B["packs"][3], "exchange": "pooled"}]}
CHANGES = {
    "Plan.model": (B, changed(B, "model.bottom_mlp", [32, 8])),
    "Plan.world_size": (B, changed(B, "world_size", 1)),  # refused: the run has 2 ranks
    "Plan.batch_size_per_rank": (B, changed(B, "batch_size_per_rank", 8)),
    "Plan.packs": (B, {**B, "packs": [{"name": "a", "tables": ["C1"]}, {"name": "a1", "tables": ["C2"]}, *B["packs"][1:]]}),
    "Plan.hot_rows": (B, changed(B, "hot_rows.C2", 10)),
    "Plan.hot_ids_file": (B, changed(B, "hot_ids_file", "other.npz")),
    "Plan.micro_batches": (B, changed(B, "micro_batches", 2)),
    "Plan.kernel_interleaving": (B, changed(B, "kernel_interleaving", True)),
    "Plan.input_pipeline": (B, changed(B, "input_pipeline", True)),
    "Plan.grad_bucket_mb": (B, changed(B, "grad_bucket_mb", 1e-6)),
    # the next step's IDs sent after the first micro-batch's pooling instead of the last
    "Plan.ids_after_mb": (PIPED, changed(PIPED, "ids_after_mb", 0)),
    # the backward layer by layer over two micro-batches: the timeline's order changes
    "Plan.backward_by_layer": (K2, changed(K2, "backward_by_layer", True)),
    # run as TorchRec runs its plans: the table-wise run's exchanges fused (the ops' order)
    "Plan.exchange": (TW, changed(TW, "exchange", "torchrec")),
    "Plan.optimizer": (B, changed(B, "optimizer.dense", "sgd")),
    "Plan.seed": (B, changed(B, "seed", 3)),
    "Plan.version": (B, changed(B, "version", 99)),  # refused
    "PackPlan.name": (B, changed(B, "packs.0.name", "a9")),
    "PackPlan.tables": (B, changed(changed(B, "packs.0.tables", ["C1"]), "packs.3.tables", ["C5", "C2"])),
    "PackPlan.sharding": (B, changed(B, "packs.0.sharding", "replicated")),
    "PackPlan.ranks": (B, changed(B, "packs.0.ranks", [1, 0])),
    "PackPlan.placement": (B, changed(B, "packs.0.placement", "host")),
    "PackPlan.hot_sync": (B, changed(B, "packs.0.hot_sync", "sparse")),
    "PackPlan.exchange": (B, changed(B, "packs.0.exchange", "pooled")),
    "OptimizerPlan.sparse": (B, changed(B, "optimizer.sparse", "rowwise_adagrad")),
    "OptimizerPlan.sparse_lr": (B, changed(B, "optimizer.sparse_lr", 0.1)),
    "OptimizerPlan.dense": (B, changed(B, "optimizer.dense", "adagrad")),
    "OptimizerPlan.dense_lr": (B, changed(B, "optimizer.dense_lr", 0.05)),
    "OptimizerPlan.eps": (B, changed(B, "optimizer.eps", 1e-2)),
    "TableSpec.name": (B, renamed_table(B)),
    "TableSpec.num_rows": (B, with_table(B, "C1", num_rows=50)),
    "TableSpec.dim": (B, changed(changed(B, "model.tables.0.dim", 4), "model.tables.1.dim", 4)),
    "TableSpec.dtype": (B, with_table(with_table(B, "C1", dtype="bf16"), "C2", dtype="bf16")),
    "TableSpec.pooling": (B, with_table(B, "C5", pooling="mean")),
    "TableSpec.optimizer": (B, with_table(B, "C4", optimizer="rowwise_adagrad")),
    "TableSpec.initializer": (B, with_table(B, "C1", initializer="normal")),
    "TableSpec.max_len": (base(din()), with_table(base(din()), "hist", max_len=3)),
}


def fields() -> list[str]:
    return [f"{k}.{f.name}" for k, cls in SCHEMA.items() for f in dataclasses.fields(cls)]


def digest(x) -> str:
    return hashlib.sha256(repr(x).encode()).hexdigest()[:16]


def observe(rank: int, world: int, plans: list[dict]) -> list[dict]:
    """For run_ranks: each plan saved and loaded as `picasso run` does, 2 timed steps; what it did."""
    import torch

    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.timing import OpTimer
    from executor.step.trainer import Trainer
    from planner.errors import PlanError

    comm = Comm()
    out = []
    for d in plans:
        with tempfile.TemporaryDirectory() as tmp:
            for name, ids in (("hot.npz", HOT), ("other.npz", OTHER_HOT)):
                np.savez(Path(tmp) / name, **{k: np.asarray(v, dtype=np.int64) for k, v in ids.items()})
            (Path(tmp) / "plan.json").write_text(json.dumps(d))
            try:
                plan = Plan.load(Path(tmp) / "plan.json")
                hot = plan.load_hot_ids(Path(tmp) / "plan.json")
                timer = OpTimer(rank, comm.device, enabled=True, micro_batches=plan.micro_batches)
                tr = Trainer(plan, hot, comm, timer)
            except (PlanError, ValueError) as exc:  # refused before any collective, on every rank
                out.append({"refused": type(exc).__name__})
                continue
        torch.manual_seed(0)
        ops = []
        rows = [local_rows(b, plan, rank) for b in synthetic_global_batches(plan, 2, seed=1)]
        for s, r in enumerate(rows):  # the next rows too, as the worker gives them (input pipeline)
            tr.step(r, rows[s + 1] if s + 1 < len(rows) else None)
            ops.append([(e[0], e[1]) for e in sorted(timer._open, key=lambda e: e[2])])
            timer.discard()
        weights, _ = tr.full_tables()
        dense = {k: v for k, v in tr.dense.state_dict().items()}
        state = [(p.name, p.layout.tables, p.layout.sharding, p.layout.local_packed_rows().tolist(),
                  p.hot_packed.tolist(), str(p.weight.dtype), tuple(p.weight.shape)) for p in tr.packs]
        out.append({"ops": digest(ops), "weights": digest({k: v.numpy().tobytes() for k, v in weights.items()}),
                    "dense": digest({k: v.numpy().tobytes() for k, v in dense.items()}), "state": digest(state)})
    return out


def test_every_field_is_run_or_listed():
    names = fields()
    for f in names:
        assert (f in PLANNING_ONLY) != (f in CHANGES), (
            f"{f}: give it a change the executor must show, or list it in executor.run.plan_fields.PLANNING_ONLY "
            "with the reason (exactly one of them)")
    assert set(PLANNING_ONLY) | set(CHANGES) <= set(names), (set(PLANNING_ONLY) | set(CHANGES)) - set(names)
    assert all(len(r) > 20 for r in PLANNING_ONLY.values())


BASES = [B, base(din()), PIPED, K2, TW]
OBSERVED = shared_call(__name__, WORLD, observe, BASES + [c for _, c in CHANGES.values()])
TWICE = shared_call(__name__, WORLD, observe, [B, B])


@pytest.mark.dist
def test_a_changed_field_changes_the_run(shared_ranks):
    bases = BASES
    plans = bases + [c for _, c in CHANGES.values()]
    per_rank = shared_ranks(OBSERVED)
    seen = [tuple(r[i] for r in per_rank) for i in range(len(plans))]
    base_seen = {digest(b): seen[i] for i, b in enumerate(bases)}
    assert all("refused" not in seen[i][0] for i in range(len(bases))), seen[: len(bases)]
    ignored = [f for (f, (b, _)), s in zip(CHANGES.items(), seen[len(bases):]) if s == base_seen[digest(b)]]
    assert not ignored, f"the executor ran these changed fields exactly as the base plan: {ignored}"


@pytest.mark.dist
def test_base_run_is_repeatable(shared_ranks):
    """The observation is deterministic: a base plan run twice is seen the same (so a
    difference above is the field's, not noise)."""
    per_rank = shared_ranks(TWICE)
    assert all(r[0] == r[1] for r in per_rank), per_rank
