"""Checkpoints: per-rank embedding shards + hot caches, dense weights and optimizer state.

Layout of a checkpoint folder DIR:
- `DIR/step-<steps>-<tag>/`: one saved version, written whole before it becomes current:
  `rank{r}.pack{k}.pt` (rank r's piece of pack k: cold shard with its rows/columns, hot
  cache, row-wise Adagrad state), `dense.pt` (dense weights, optimizer state, steps done)
  and `manifest.json` (format, model fingerprint, world size, step, size and SHA-256 of
  every file). One file per rank and pack lets a load hold one pack at a time;
- `DIR/manifest.json`: the same manifest plus `dir`, the current version. Replacing it
  (one atomic rename, after every file of the new version is fsynced) is the switch, so
  a save killed at any point leaves the previous checkpoint whole and current.
The last `keep` versions stay; `--resume DIR/step-...` resumes an older one.

Loading requires exactly the files the world size implies, checks every one against the
manifest, refuses a foreign model, and reads tensors only (`weights_only=True`): the
manifest sits beside the files and proves nothing about who wrote them, so a file must
not be able to run code. It then rebuilds whole tables from all pieces and takes the
shards the current plan needs, so a checkpoint loads under any plan and world size. It
assembles one saved pack at a time and hands each current pack its shard as soon as its
tables are complete, so a resume needs about one pack beyond the run's own memory, not
every table on every rank.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import json
import os
import pickle
import re
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path

import torch

from executor.run.config import MAX_STEPS
from executor.sparse.embedding import CoverageError
from executor.step.trainer import Trainer, tables_from_pieces
from foundation import fields
from foundation.documents import read_json
from foundation.files import atomic_write_bytes, fsync_dir
from foundation.outputs import holds_document
from planner.errors import PlanError
from planner.model_spec import ModelSpec
from planner.plan import Plan
from planner.sharding import Sharding

FORMAT = "picasso-checkpoint-3"
FORMAT_V2 = "picasso-checkpoint-2"  # one file per rank holding every pack; still loads
FORMAT_V1 = "picasso-checkpoint-1"  # files beside the manifest, no versions; still loads
VERSION_RE = re.compile(r"step-\d{8,}-[0-9a-f]{6}")
MAX_MANIFEST_BYTES = 16 << 20
MAX_WORLD = 1 << 16
DEFAULT_KEEP = 2


class CheckpointError(ValueError):
    """A checkpoint that is incomplete, damaged or belongs to another model."""


def is_checkpoint_folder(path: Path) -> bool:
    """A checkpoint folder picasso wrote before folders carried a marker: its manifest names a
    checkpoint format, or it holds only the versions of a first save that never finished."""
    if not (path / "manifest.json").exists():
        return all(VERSION_RE.fullmatch(n) for n in os.listdir(path) if not n.startswith("."))
    return holds_document(path, "manifest.json", "checkpoint manifest",
                          lambda m: m.get("format") in (FORMAT, FORMAT_V2, FORMAT_V1))


def model_fingerprint(plan: Plan) -> str:
    return spec_fingerprint(plan.model)


def spec_fingerprint(model: ModelSpec) -> str:
    return hashlib.sha256(json.dumps(model.to_dict(), sort_keys=True).encode()).hexdigest()[:16]


def expected_files(world_size: int, packs: int, fmt: str = FORMAT) -> list[str]:
    """Every file a checkpoint of `world_size` ranks and `packs` packs must hold."""
    return list(_expected_names(world_size, packs, fmt))


def _expected_names(world_size: int, packs: int, fmt: str) -> Iterator[str]:
    """expected_files one name at a time: a manifest's numbers alone never size a list."""
    if fmt != FORMAT:
        yield from (f"rank{r}.pt" for r in range(world_size))
    else:
        yield from (_piece_file(r, k) for r in range(world_size) for k in range(packs))
    yield "dense.pt"


def _piece_file(rank: int, pack: int) -> str:
    return f"rank{rank}.pack{pack}.pt"


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


def _stage(rank: int, name: str) -> None:
    """Test hook: PICASSO_CKPT_FAULT=RANK:STAGE kills that rank at that stage of a save."""
    spec = os.environ.get("PICASSO_CKPT_FAULT")
    if spec and spec == f"{rank}:{name}":
        os._exit(3)


def _agree(comm, value: str) -> str:
    """Rank 0's `value` on every rank."""
    if comm.world == 1:
        return value
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def eval_record(res: dict | None, data: str | None) -> dict | None:
    """The manifest's `last_eval`: an evaluation's step, rows, AUC (None when undefined) and logloss."""
    if res is None:
        return None
    a = res.get("auc")
    return {"step": int(res["step"]), "rows": int(res["rows"]), "auc": None if a is None or a != a else float(a),
            "logloss": float(res["logloss"]), **({"data": str(data)} if data else {})}


def _validate_eval(e: object) -> None:
    fields.mapping(e, "last_eval")
    fields.integer(e.get("step"), "last_eval.step", 0)
    fields.integer(e.get("rows"), "last_eval.rows", 1)
    if e.get("auc") is not None:
        fields.real(e.get("auc"), "last_eval.auc", 0.0, 1.0)
    fields.real(e.get("logloss"), "last_eval.logloss", 0.0)
    if "data" in e:
        fields.text(e.get("data"), "last_eval.data")


def save(trainer: Trainer, folder: str | os.PathLike, data_position: int | None = None,
         keep: int = DEFAULT_KEEP, evaluation: dict | None = None) -> Path:
    """Collective: write a new version beside the current one, then switch to it; returns its folder.
    `evaluation` (an `eval_record`) is kept in the manifest as `last_eval`."""
    if keep < 1:
        raise ValueError(f"--keep must be at least 1, got {keep}")
    folder = Path(folder)
    comm = trainer.comm
    rank = comm.rank
    name = ""
    if rank == 0:
        if folder.exists() and not folder.is_dir():
            raise CheckpointError(f"{folder}: exists and is not a folder")
        name = f"step-{trainer.steps_done:08d}-{secrets.token_hex(3)}"
        (folder / name).mkdir(parents=True)
    name = _agree(comm, name)
    version = folder / name
    try:
        _stage(rank, "start")
        for k, p in enumerate(trainer.packs):
            atomic_write_bytes(version / _piece_file(rank, k), _torch_bytes({"rank": rank, "pack": p.shard_state()}))
        _stage(rank, "shard")
        if rank == 0:
            dense = {"dense": trainer.dense.state_dict(), "optimizer": trainer.opt.state_dict(), "steps": trainer.steps_done}
            atomic_write_bytes(version / "dense.pt", _torch_bytes(dense))
        _stage(rank, "dense")
        comm.barrier()  # every file of the version is written and fsynced
        if rank == 0:
            manifest = {
                "format": FORMAT,
                "model": trainer.plan.model.name,
                "model_fingerprint": model_fingerprint(trainer.plan),
                "model_spec": trainer.plan.model.to_dict(),  # the checkpoint describes its own model
                "world_size": comm.world,
                "packs": [[p.name, list(p.tables), p.sharding] for p in trainer.plan.packs],
                "steps": trainer.steps_done,
                "data_position": trainer.steps_done if data_position is None else int(data_position),
                "files": {f: {"bytes": (version / f).stat().st_size, "sha256": _sha(version / f)}
                          for f in expected_files(comm.world, len(trainer.packs))},
                **({"last_eval": evaluation} if evaluation else {}),
            }
            atomic_write_bytes(version / "manifest.json", _json_bytes(manifest))
            _stage(rank, "version")
            atomic_write_bytes(folder / "manifest.json", _json_bytes({**manifest, "dir": name}))  # the switch
            _stage(rank, "switch")
    except BaseException:
        # a full disk or a dead peer: free what the new version took (every failing rank tries,
        # the last one out finds no peer still writing there)
        if _current(folder) != name:
            shutil.rmtree(version, ignore_errors=True)
        raise
    if rank == 0:
        prune(folder, keep)
    comm.barrier()
    return version


def _read_manifest_doc(mpath: Path) -> object:
    """A manifest's JSON, bounded in size, nesting and numbers (foundation.documents)."""
    return read_json(mpath, "checkpoint manifest", MAX_MANIFEST_BYTES)


def _current(folder: Path) -> str | None:
    """The version the folder's manifest points to (None when unreadable)."""
    try:
        return _read_manifest_doc(folder / "manifest.json").get("dir")
    except (OSError, ValueError, AttributeError):
        return None


def _json_bytes(doc: dict) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode()


def versions(folder: str | os.PathLike) -> list[Path]:
    """The version folders in `folder`, oldest first."""
    folder = Path(folder)
    found = [p for p in folder.iterdir() if p.is_dir() and VERSION_RE.fullmatch(p.name)] if folder.is_dir() else []
    return sorted(found, key=lambda p: (int(p.name.split("-")[1]), p.stat().st_mtime_ns))


def prune(folder: Path, keep: int) -> None:
    """Keep the current version and the newest complete ones up to `keep`; drop the rest.

    Folders without a manifest are leftovers of interrupted saves. The manifest is read
    again before each removal: whatever it names is never removed (one writer holds the
    folder, foundation.locks; this guards a writer that does not take the lock).
    """
    current = _read_manifest_doc(folder / "manifest.json").get("dir")  # unreadable: raise, never prune blind
    complete = [v for v in versions(folder) if (v / "manifest.json").is_file() and v.name != current]
    kept = {current, *(v.name for v in complete[max(0, len(complete) - (keep - 1)):] if keep > 1)}
    for v in versions(folder):
        if v.name not in kept and v.name != _current(folder):
            shutil.rmtree(v, ignore_errors=True)
    fsync_dir(folder)


def validate_manifest(m: object, mpath: Path) -> dict:
    """The manifest's fields checked for type and range; CheckpointError names the field."""
    try:
        fields.mapping(m, "(top level)")
        fmt = m.get("format")
        if fmt not in (FORMAT, FORMAT_V2, FORMAT_V1):
            raise CheckpointError(f"{mpath}: not a picasso checkpoint (format {fmt!r})")
        world = fields.integer(m.get("world_size"), "world_size", 1, MAX_WORLD)
        fields.integer(m.get("steps"), "steps", 0, MAX_STEPS)
        fields.integer(m.get("data_position"), "data_position", 0, MAX_STEPS)
        if m.get("last_eval") is not None:
            _validate_eval(m["last_eval"])
        fields.text(m.get("model_fingerprint"), "model_fingerprint")
        fields.text(m.get("model"), "model")
        if "model_spec" in m:
            fields.mapping(m["model_spec"], "model_spec")
        packs = fields.sequence(m.get("packs", []), "packs")
        if fmt == FORMAT and not packs:
            raise fields.FieldError("field packs: a checkpoint holds at least one pack")
        for i, p in enumerate(packs):  # [name, tables, sharding]
            p = fields.sequence(p, f"packs[{i}]")
            if len(p) != 3:
                raise fields.FieldError(f"field packs[{i}]: expected [name, tables, sharding]")
            fields.text(p[0], f"packs[{i}][0]")
            for j, t in enumerate(fields.sequence(p[1], f"packs[{i}][1]")):
                fields.text(t, f"packs[{i}][1][{j}]")
            fields.text(p[2], f"packs[{i}][2]")
        if "dir" in m and not (isinstance(m["dir"], str) and VERSION_RE.fullmatch(m["dir"])):
            raise fields.FieldError(f"field dir: expected a version folder name step-<steps>-<tag>, got {m['dir']!r}")
        files = fields.mapping(m.get("files"), "files")
        # world_size and packs are only numbers in the file: no list of names grows past its entries
        count = (world * len(packs) if fmt == FORMAT else world) + 1
        if len(files) < count:  # a name is missing: found within the first len(files) + 1 names
            missing = next(f for f in _expected_names(world, len(packs), fmt) if f not in files)
            shown = ", ".join(itertools.islice(_expected_names(world, len(packs), fmt), 4))
            raise fields.FieldError(f"field files: {missing} is missing: a checkpoint of world_size {world} holds "
                                    f"{shown}{', ...' if count > 4 else ''} ({count:,} files)")
        want = expected_files(world, len(packs), fmt)
        extra = sorted(set(files) - set(want))
        if extra:
            raise fields.FieldError(f"field files: unexpected entry {extra[0]!r} for world_size {world}")
        for f in want:
            info = fields.mapping(files[f], f"files.{f}")
            fields.integer(info.get("bytes"), f"files.{f}.bytes", 0)
            sha = info.get("sha256")
            if not (isinstance(sha, str) and re.fullmatch(r"[0-9a-f]{64}", sha)):
                raise fields.FieldError(f"field files.{f}.sha256: expected 64 hex digits")
    except fields.FieldError as exc:
        raise CheckpointError(f"{mpath}: {exc}") from None
    return m


def check_resume(folder: str | os.PathLike | None, plan: Plan) -> None:
    """--resume's folder before any rank starts: a checkpoint of the plan's model whose files are
    all there at their sizes (the ranks check the checksums as they read)."""
    if folder is not None:
        read_manifest(folder, plan, checksums=False)


def read_manifest(folder: str | os.PathLike, plan: Plan | None = None, checksums: bool = True) -> dict:
    """The manifest after checking every file the world size implies; raises CheckpointError.

    The returned dict holds `_files_dir`, the folder the files are read from.
    """
    folder = Path(folder)
    mpath = folder / "manifest.json"
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: no such checkpoint folder")
    if not mpath.exists():
        raise CheckpointError(f"{folder}: no manifest.json: the checkpoint is incomplete (torn) or not a checkpoint")
    try:
        m = _read_manifest_doc(mpath)
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{mpath}: damaged manifest ({exc})") from None
    except (OSError, ValueError) as exc:
        raise CheckpointError(str(exc)) from None
    validate_manifest(m, mpath)
    if "model_spec" in m:  # the model a checkpoint carries is checked as it is read, as every other field
        try:
            ModelSpec.from_dict(m["model_spec"], "model_spec")
        except (PlanError, ValueError, TypeError, KeyError) as exc:
            raise CheckpointError(f"{mpath}: {exc}") from None
    base = folder / m["dir"] if "dir" in m else folder
    for name, info in m["files"].items():
        f = base / name
        if not f.exists():
            raise CheckpointError(f"{f}: missing: the checkpoint is torn")
        if not f.is_file():
            raise CheckpointError(f"{f}: not a regular file")
        if f.stat().st_size != info["bytes"] or (checksums and _sha(f) != info["sha256"]):
            raise CheckpointError(f"{f}: size or checksum differs from the manifest: the checkpoint is torn or damaged")
    if plan is not None and m.get("model_fingerprint") != model_fingerprint(plan):
        raise CheckpointError(
            f"{folder}: checkpoint of model {m.get('model')!r} does not match the plan's model "
            f"{plan.model.name!r} (different tables or dense architecture)"
        )
    return {**m, "_files_dir": str(base)}


def _load_tensors(path: Path) -> dict:
    """A torch file holding tensors and plain containers only: unpickling runs no code."""
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError, TypeError, AttributeError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CheckpointError(f"{path}: not a tensor-only picasso checkpoint file, refused ({first[:200]})") from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a dict of tensors, got {type(d).__name__}")
    return d


def saved_model(m: dict, plan: Plan | None = None) -> ModelSpec:
    """The model a checkpoint whose manifest `read_manifest` returned holds: the spec it saved, or
    `plan`'s model for a checkpoint written before manifests carried one (checked against the
    fingerprint either way)."""
    where = Path(m["_files_dir"]) / "manifest.json"
    if "model_spec" in m:
        try:
            model = ModelSpec.from_dict(m["model_spec"], "model_spec")
        except PlanError as exc:
            raise CheckpointError(f"{where}: {exc}") from None
    elif plan is not None:
        model = plan.model
    else:
        raise CheckpointError(f"{where}: this checkpoint does not name its model's tables (saved by an older "
                              "version): give the plan it was trained with")
    if spec_fingerprint(model) != m["model_fingerprint"]:
        against = "its saved model spec" if "model_spec" in m else f"the plan's model {model.name!r}"
        raise CheckpointError(f"{where}: checkpoint of model {m['model']!r} does not match {against} "
                              "(different tables or dense architecture)")
    return model




def _piece(path: Path, model: ModelSpec, tables: list[str] | None = None) -> dict:
    """A saved pack piece, its tensors' shapes and dtypes checked against the model and the
    manifest (`tables`: the pack's tables there) before any is used; CheckpointError names the
    file and the pack's tables."""
    piece = _load_tensors(path)["pack"]
    try:
        check_piece(piece, model, tables)
    except ValueError as exc:
        what = ", ".join(repr(t) for t in (tables or piece.get("tables") or [])[:3])
        raise CheckpointError(f"{path}: table {what}: {exc}") from None
    return piece


def check_piece(piece: object, model: ModelSpec, tables: list[str] | None) -> None:
    """ValueError unless `piece` is a shard_state of a pack of `model` whose tensors hold
    one row per saved row (and the saved columns) and one row per hot row, in a float dtype."""
    if not isinstance(piece, dict):
        raise ValueError(f"expected a pack piece, got {type(piece).__name__}")
    names = piece.get("tables")
    if not isinstance(names, (list, tuple)) or not names or (tables is not None and list(names) != list(tables)):
        raise ValueError(f"the piece's tables {names!r} differ from the manifest's {tables!r}")
    try:
        specs = [model.table(str(t)) for t in names]
    except (KeyError, ValueError):
        raise ValueError(f"the piece names tables {list(names)!r} the model does not have") from None
    dim = specs[0].dim
    rows, hot = piece.get("rows"), piece.get("hot_rows")
    cols = piece.get("cols")
    for name, t in (("rows", rows), ("hot_rows", hot)):
        if not isinstance(t, torch.Tensor) or t.dim() != 1 or t.dtype.is_floating_point or t.is_complex():
            raise ValueError(f"{name} must be a 1-D integer tensor")
    if (not isinstance(cols, (list, tuple)) or len(cols) != 2 or not all(isinstance(c, int) for c in cols)
            or not 0 <= cols[0] <= cols[1] <= dim):
        raise ValueError(f"cols {cols!r} must be [first, end] within the tables' {dim} columns")
    want = {"weight": (len(rows), cols[1] - cols[0]), "hot_weight": (len(hot), dim),
            "state": (len(rows),), "hot_state": (len(hot),)}
    for name, shape in want.items():
        t = piece.get(name)
        if t is None and name.endswith("state"):
            continue
        if not isinstance(t, torch.Tensor) or not t.dtype.is_floating_point:
            raise ValueError(f"{name} must be a float tensor")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name} is {' x '.join(map(str, t.shape)) or 'a scalar'}, expected "
                             f"{' x '.join(map(str, shape))} (one row per saved row"
                             f"{', the saved columns' if name == 'weight' else ''})")
    if (piece.get("state") is None) != (piece.get("hot_state") is None):
        raise ValueError("state and hot_state must both be saved or both be absent")


def _saved_packs(m: dict, model: ModelSpec, only: set[str] | None) -> Iterator[tuple[dict, dict]]:
    """(weights, states) per table of each saved pack holding a table of `only` (None: all),
    one pack at a time."""
    base, world = Path(m["_files_dir"]), int(m["world_size"])
    if m["format"] != FORMAT:  # older layouts hold every pack in one file per rank
        by_rank = [_load_tensors(base / f"rank{r}.pt")["packs"] for r in range(world)]
        for r, packs in enumerate(by_rank):
            for piece in packs:
                try:
                    check_piece(piece, model, None)
                except ValueError as exc:
                    raise CheckpointError(f"{base / f'rank{r}.pt'}: {exc}") from None
        for pieces in zip(*by_rank):
            yield tables_from_pieces(model, [list(pieces)])
        return
    for k, (_, tables, sharding) in enumerate(m["packs"]):
        if only is not None and not only.intersection(tables):
            continue
        holders = range(1) if sharding == Sharding.REPLICATED else range(world)  # replicas are identical
        try:
            yield tables_from_pieces(model, [[_piece(base / _piece_file(r, k), model, tables) for r in holders]])
        except CoverageError as exc:
            raise CheckpointError(f"{base}: {_uncovered(model, tables, exc)}: the checkpoint is damaged") from None


def _uncovered(model: ModelSpec, tables: list[str], exc: CoverageError) -> str:
    """Which table's rows a saved pack's pieces leave out (or give twice), in the table's own numbering."""
    first = int(exc.rows[0])
    off = 0
    for t in tables:
        n = model.table(t).num_rows
        if first < off + n:
            mine = [int(r) - off for r in exc.rows if off <= int(r) < off + n]
            break
        off += n
    else:  # rows past the tables the manifest names
        t, mine = "?", [int(r) for r in exc.rows]
    spans, start = [], mine[0]
    for a, b in zip(mine, mine[1:] + [None]):
        if b != a + 1:
            spans.append(f"{start}" if start == a else f"{start}-{a}")
            if b is not None:
                start = b
    how = "in no saved piece" if exc.count == 0 else f"in {exc.count} saved pieces (expected exactly one)"
    more = f" and {len(spans) - 3} more ranges" if len(spans) > 3 else ""
    return f"table {t!r} rows {', '.join(spans[:3])}{more} ({len(mine)} rows) are {how}"


def saved_tables(m: dict, model: ModelSpec, only: set[str] | None = None
                 ) -> Iterator[tuple[str, torch.Tensor, torch.Tensor | None]]:
    """Each table's full weight and row state (None without one) of a checkpoint whose
    manifest `read_manifest` returned, one saved pack in memory at a time; with `only`, at
    least those tables (and the others of their saved packs)."""
    try:
        for weights, states in _saved_packs(m, model, only):
            for t, w in weights.items():
                yield t, w, states.get(t)
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{m['_files_dir']}: checkpoint content does not fit the model ({type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None


def saved_dense(m: dict) -> dict[str, torch.Tensor]:
    """The dense model's weights of a checkpoint whose manifest `read_manifest` returned."""
    path = Path(m["_files_dir"]) / "dense.pt"
    d = _load_tensors(path).get("dense")
    if not isinstance(d, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in d.items()):
        raise CheckpointError(f"{path}: holds no dense weights")
    return d


def _load_own_piece(p, k: int, m: dict, rank: int) -> bool:
    """Resume under the saving plan and world size: pack `k` takes this rank's own saved
    piece when it is exactly its shard. False when it must be resharded from every piece."""
    if m["format"] != FORMAT or int(m["world_size"]) != p.layout.world or k >= len(m["packs"]):
        return False
    name, tables, sharding = m["packs"][k]
    if name != p.layout.name or list(tables) != list(p.layout.tables) or sharding != p.layout.sharding:
        return False
    try:
        piece = _piece(Path(m["_files_dir"]) / _piece_file(rank, k), p.plan.model, list(tables))
        if not p.matches_piece(piece):
            return False
        p.load_piece(piece)
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{m['_files_dir']}: checkpoint content does not fit the model ({type(exc).__name__})") from None
    return True


def _check_dense(saved: object, own: dict, path: Path) -> None:
    """The saved dense weights hold exactly the model's tensors, each of its shape and a float dtype."""
    if not isinstance(saved, dict) or set(saved) != set(own):
        names = sorted(set(saved) ^ set(own)) if isinstance(saved, dict) else ["(not a dict)"]
        raise CheckpointError(f"{path}: dense weights differ from the model's in {names[:3]}")
    for name, t in own.items():
        s = saved[name]
        if not isinstance(s, torch.Tensor) or tuple(s.shape) != tuple(t.shape) or s.dtype.is_floating_point != \
                t.dtype.is_floating_point:
            got = f"{' x '.join(map(str, s.shape))} {s.dtype}" if isinstance(s, torch.Tensor) else type(s).__name__
            raise CheckpointError(f"{path}: dense weight {name!r} is {got}, expected "
                                  f"{' x '.join(map(str, t.shape))} {t.dtype}")


def load(trainer: Trainer, folder: str | os.PathLike) -> dict:
    """Load into `trainer` under its own plan (any plan or world size of the same model)."""
    folder = Path(folder)
    m = read_manifest(folder, trainer.plan)
    base = Path(m["_files_dir"])
    for p in trainer.packs:  # every pack is overwritten below; a failed load ends the run
        p.release()
    waiting = [p for k, p in enumerate(trainer.packs) if not _load_own_piece(p, k, m, trainer.comm.rank)]
    ready: dict[str, tuple[torch.Tensor, torch.Tensor | None]] = {}
    needed = {t for p in waiting for t in p.layout.tables}
    for t, w, s in (saved_tables(m, trainer.plan.model, needed) if waiting else ()):
        if t not in needed:
            continue
        ready[t] = (w, s)
        for p in [p for p in waiting if all(t in ready for t in p.layout.tables)]:
            parts = [ready.pop(t) for t in p.layout.tables]
            state = torch.cat([s for _, s in parts]) if all(s is not None for _, s in parts) else None
            try:
                p.load_full(torch.cat([w for w, _ in parts]), state)
            except (IndexError, RuntimeError, ValueError) as exc:
                raise CheckpointError(f"{base}: checkpoint content does not fit the model ({type(exc).__name__})") from None
            waiting.remove(p)
    if waiting:
        missing = [t for p in waiting for t in p.layout.tables if t not in ready]
        raise CheckpointError(f"{base}: no saved rows for table {missing[0]!r}")
    try:
        dense = _load_tensors(base / "dense.pt")
        _check_dense(dense.get("dense"), trainer.dense.state_dict(), base / "dense.pt")
        trainer.dense.load_state_dict(dense["dense"])
        trainer.opt.load_state_dict(dense["optimizer"])
        steps = dense["steps"]
    except CheckpointError:
        raise
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{base}: checkpoint content does not fit the model ({type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''})") from None
    if not isinstance(steps, int) or steps != m["steps"]:
        raise CheckpointError(f"{base / 'dense.pt'}: steps {steps!r} differ from the manifest's {m['steps']}")
    trainer.steps_done = steps
    return m
