"""Checkpoints: per-rank embedding shards + hot caches, dense weights and optimizer state.

Layout of a checkpoint folder:
- `rank{r}.pt`: that rank's pieces of every pack (cold shard with its rows/columns, hot
  cache, row-wise Adagrad state), written by rank r;
- `dense.pt`: dense weights, dense optimizer state, steps done (written by rank 0);
- `manifest.json`: written last by rank 0 after a barrier: format version, model
  fingerprint, world size, step, and the size and SHA-256 of every file.
Every file is written to a temp name and renamed. Loading checks the manifest and every
file against it (a torn checkpoint is refused), checks the model fingerprint (a foreign
checkpoint is refused), then rebuilds whole tables from all pieces and takes the shards
the current plan needs, so a checkpoint loads under any plan and world size.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from pathlib import Path

import torch

from executor.trainer import Trainer, tables_from_pieces
from planner.plan import Plan, atomic_write_bytes

FORMAT = "picasso-checkpoint-1"


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, damaged or belongs to another model."""


def model_fingerprint(plan: Plan) -> str:
    return hashlib.sha256(json.dumps(plan.model.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def _torch_bytes(obj) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _sha(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def save(trainer: Trainer, folder: str | os.PathLike, data_position: int | None = None) -> None:
    """Collective: every rank writes its file, rank 0 the dense file and then the manifest."""
    folder = Path(folder)
    comm = trainer.comm
    folder.mkdir(parents=True, exist_ok=True)
    if comm.rank == 0:
        old = folder / "manifest.json"
        if old.exists():  # the folder is torn while it is being rewritten
            old.unlink()
    comm.barrier()
    pieces = [p.shard_state() for p in trainer.packs]
    atomic_write_bytes(folder / f"rank{comm.rank}.pt", _torch_bytes({"rank": comm.rank, "packs": pieces}))
    if comm.rank == 0:
        dense = {
            "dense": trainer.dense.state_dict(),
            "optimizer": trainer.opt.state_dict(),
            "steps": trainer.steps_done,
        }
        atomic_write_bytes(folder / "dense.pt", _torch_bytes(dense))
    comm.barrier()
    if comm.rank == 0:
        files = [f"rank{r}.pt" for r in range(comm.world)] + ["dense.pt"]
        manifest = {
            "format": FORMAT,
            "model": plan_model_name(trainer.plan),
            "model_fingerprint": model_fingerprint(trainer.plan),
            "world_size": comm.world,
            "packs": [[p.name, list(p.tables), p.sharding] for p in trainer.plan.packs],
            "steps": trainer.steps_done,
            "data_position": trainer.steps_done if data_position is None else data_position,
            "files": {f: {"bytes": (folder / f).stat().st_size, "sha256": _sha(folder / f)} for f in files},
        }
        atomic_write_bytes(folder / "manifest.json", (json.dumps(manifest, indent=2) + "\n").encode())
    comm.barrier()


def plan_model_name(plan: Plan) -> str:
    return plan.model.name


def read_manifest(folder: str | os.PathLike, plan: Plan | None = None) -> dict:
    """The manifest after checking every file it lists; raises CheckpointError."""
    folder = Path(folder)
    mpath = folder / "manifest.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not mpath.exists():
        raise CheckpointError(f"{folder}: no manifest.json: the checkpoint is incomplete (torn) or not a checkpoint")
    try:
        m = json.loads(mpath.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{mpath}: damaged manifest ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(m, dict) or m.get("format") != FORMAT:
        raise CheckpointError(f"{mpath}: not a picasso checkpoint (format {m.get('format') if isinstance(m, dict) else None!r})")
    for name, info in m.get("files", {}).items():
        f = folder / name
        if not f.exists():
            raise CheckpointError(f"{f}: missing: the checkpoint is torn")
        if f.stat().st_size != info["bytes"] or _sha(f) != info["sha256"]:
            raise CheckpointError(f"{f}: size or checksum differs from the manifest: the checkpoint is torn or damaged")
    if plan is not None and m.get("model_fingerprint") != model_fingerprint(plan):
        raise CheckpointError(
            f"{folder}: checkpoint of model {m.get('model')!r} does not match the plan's model "
            f"{plan.model.name!r} (different tables or dense architecture)"
        )
    return m


def load(trainer: Trainer, folder: str | os.PathLike) -> dict:
    """Load into `trainer` under its own plan (any plan or world size of the same model)."""
    folder = Path(folder)
    m = read_manifest(folder, trainer.plan)
    pieces_by_rank = []
    for r in range(int(m["world_size"])):
        d = torch.load(folder / f"rank{r}.pt", map_location="cpu", weights_only=False)
        pieces_by_rank.append(d["packs"])
    per_pack = [list(x) for x in zip(*pieces_by_rank)]
    weights, states = tables_from_pieces(trainer.plan, per_pack)
    for p in trainer.packs:
        L = p.layout
        w = torch.cat([weights[t] for t in L.tables])
        s = torch.cat([states[t] for t in L.tables]) if all(t in states for t in L.tables) else None
        p.load_full(w, s)
    dense = torch.load(folder / "dense.pt", map_location="cpu", weights_only=False)
    trainer.dense.load_state_dict(dense["dense"])
    trainer.opt.load_state_dict(dense["optimizer"])
    trainer.steps_done = int(dense["steps"])
    return m
