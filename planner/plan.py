"""The Plan: a versioned JSON document the planner writes and the executor runs.

Conventions every layer relies on:
- Packed rows: the tables of a pack are stacked in the pack's order; table t's row r is
  packed row `offset[t] + r` (`Plan.table_offsets`). Raw IDs map to rows as
  `id % num_rows`.
- Row-wise sharding is cyclic over the pack's ranks: packed row p lives on
  `ranks[p % n]` at local row `p // n`. Table-wise: the whole pack on `ranks[0]`.
  Column-wise: the dim is split as numpy.array_split over the ranks. Replicated: every
  rank holds every row (data parallel). Table-row-wise (TorchRec's TWRW): row-wise
  (cyclic, as above) over ranks of one node; several such packs spread a group of tables
  over the nodes. Its rows are laid out exactly as row-wise; only the exchange differs
  (hierarchical: inside the node first, then across nodes; see planner.lowering).
- Hot rows are replicated on every rank: `hot_ids` (npz next to the plan, one int64
  array of table-local rows per table, hottest first) lists them; the cold partition
  still owns every row, hot rows there are simply never read.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from planner.errors import PlanError
from planner.model_spec import ModelSpec

PLAN_VERSION = 1
SHARDINGS = ("row_wise", "table_wise", "column_wise", "replicated", "table_row_wise")
PLACEMENTS = ("hbm", "host")
HOT_SYNCS = ("dense", "sparse")
SPARSE_OPTIMIZERS = ("sgd", "rowwise_adagrad")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")


@dataclass
class PackPlan:
    name: str
    tables: list[str]
    sharding: str = "row_wise"
    ranks: list[int] | None = None  # ranks holding shards; None means every rank
    placement: str = "hbm"  # where cold rows live: device memory or host memory over PCIe
    # how the hot rows' gradients are synchronised: "dense", the whole hot set's gradient in
    # the dense all-reduce; "sparse", an all-gather of only the hot rows touched this step.
    # The planner picks the cheaper by its cost model (planner.lowering.hot_sync_costs)
    hot_sync: str = "dense"


@dataclass
class OptimizerPlan:
    sparse: str = "sgd"
    sparse_lr: float = 0.05
    dense: str = "sgd"
    dense_lr: float = 0.05
    eps: float = 1e-8


def model_optimizer(model: ModelSpec) -> OptimizerPlan:
    """The optimizer a model asks for: extra["dense_optimizer"] for the dense layers, and
    row-wise Adagrad for the tables when they say so (MLPerf DLRM-DCNv2 trains with Adagrad)."""
    sparse = "rowwise_adagrad" if any(t.optimizer == "rowwise_adagrad" for t in model.tables) else "sgd"
    lr = float(model.extra.get("lr", OptimizerPlan.sparse_lr))
    return OptimizerPlan(sparse=sparse, sparse_lr=lr, dense=str(model.extra.get("dense_optimizer", "sgd")), dense_lr=lr)


@dataclass
class Plan:
    model: ModelSpec
    world_size: int
    batch_size_per_rank: int
    packs: list[PackPlan]
    hot_rows: dict[str, int] = field(default_factory=dict)  # table -> hot-set size (0 if absent)
    hot_ids_file: str | None = None  # npz relative to the plan file
    micro_batches: int = 1
    kernel_interleaving: bool = False
    optimizer: OptimizerPlan = field(default_factory=OptimizerPlan)
    hardware: str | None = None  # name of the hardware spec it was planned for
    seed: int = 0
    notes: dict[str, Any] = field(default_factory=dict)  # planner's explanation, predicted times
    version: int = PLAN_VERSION

    # ---- derived views -------------------------------------------------------------
    def pack_of(self, table: str) -> PackPlan:
        for p in self.packs:
            if table in p.tables:
                return p
        raise PlanError(f"table {table!r} is in no pack")

    def pack_ranks(self, pack: PackPlan) -> list[int]:
        return list(range(self.world_size)) if pack.ranks is None else list(pack.ranks)

    def table_offsets(self, pack: PackPlan) -> dict[str, int]:
        """Row offset of each table inside the packed table."""
        offsets, acc = {}, 0
        for t in pack.tables:
            offsets[t] = acc
            acc += self.model.table(t).num_rows
        return offsets

    def pack_rows(self, pack: PackPlan) -> int:
        return sum(self.model.table(t).num_rows for t in pack.tables)

    @property
    def global_batch(self) -> int:
        return self.batch_size_per_rank * self.world_size

    # ---- validation --------------------------------------------------------------
    def validate(self) -> None:
        self.model.validate()
        if self.version != PLAN_VERSION:
            raise PlanError(f"plan version {self.version} is not supported (expected {PLAN_VERSION})")
        if self.world_size < 1 or self.batch_size_per_rank < 1:
            raise PlanError("world_size and batch_size_per_rank must be at least 1")
        if self.micro_batches < 1 or self.batch_size_per_rank % self.micro_batches:
            raise PlanError(
                f"micro_batches={self.micro_batches} must be >= 1 and divide "
                f"batch_size_per_rank={self.batch_size_per_rank}"
            )
        known = set(self.model.table_names)
        seen: dict[str, str] = {}
        names = set()
        for p in self.packs:
            if p.name in names:
                raise PlanError(f"pack name {p.name!r} is used twice")
            names.add(p.name)
            if not p.tables:
                raise PlanError(f"pack {p.name} has no tables")
            if p.sharding not in SHARDINGS:
                raise PlanError(f"pack {p.name}: sharding {p.sharding!r} is not one of {list(SHARDINGS)}")
            if p.placement not in PLACEMENTS:
                raise PlanError(f"pack {p.name}: placement {p.placement!r} is not one of {list(PLACEMENTS)}")
            if p.hot_sync not in HOT_SYNCS:
                raise PlanError(f"pack {p.name}: hot_sync {p.hot_sync!r} is not one of {list(HOT_SYNCS)}")
            ranks = self.pack_ranks(p)
            if not ranks or len(set(ranks)) != len(ranks) or any(not 0 <= r < self.world_size for r in ranks):
                raise PlanError(f"pack {p.name}: ranks {p.ranks} must be distinct ranks in [0, {self.world_size})")
            if p.sharding == "table_wise" and len(ranks) != 1:
                raise PlanError(f"pack {p.name}: table_wise sharding needs exactly one rank, got {ranks}")
            attrs = None
            for t in p.tables:
                if t not in known:
                    raise PlanError(f"pack {p.name}: unknown table {t!r}")
                if t in seen:
                    raise PlanError(f"table {t} is in two packs: {seen[t]} and {p.name}")
                seen[t] = p.name
                a = self.model.table(t).attributes()
                if attrs is not None and a != attrs:
                    raise PlanError(
                        f"pack {p.name}: table {t} differs in dim/dtype/optimizer/initializer/pooling "
                        "from the pack's first table"
                    )
                attrs = a
            if p.sharding == "column_wise" and self.model.table(p.tables[0]).dim < len(ranks):
                raise PlanError(f"pack {p.name}: column_wise over {len(ranks)} ranks needs dim >= ranks")
        missing = known - set(seen)
        if missing:
            raise PlanError(f"tables in no pack: {', '.join(sorted(missing))}")
        for t, n in self.hot_rows.items():
            if t not in known:
                raise PlanError(f"hot_rows: unknown table {t!r}")
            rows = self.model.table(t).num_rows
            if not 0 <= n <= rows:
                raise PlanError(f"hot_rows[{t}]={n} is outside [0, {rows}] (the table's rows)")
        if any(self.hot_rows.values()) and not self.hot_ids_file:
            raise PlanError("hot_rows are set but hot_ids_file is missing")
        if self.optimizer.sparse not in SPARSE_OPTIMIZERS:
            raise PlanError(f"sparse optimizer {self.optimizer.sparse!r} is not one of {list(SPARSE_OPTIMIZERS)}")
        if self.optimizer.dense not in DENSE_OPTIMIZERS:
            raise PlanError(f"dense optimizer {self.optimizer.dense!r} is not one of {list(DENSE_OPTIMIZERS)}")

    # ---- JSON --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("model", "packs", "optimizer")}
        d["model"] = self.model.to_dict()
        d["packs"] = [asdict(p) for p in self.packs]
        d["optimizer"] = asdict(self.optimizer)
        return {"version": self.version, **{k: v for k, v in d.items() if k != "version"}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        if not isinstance(d, dict):
            raise PlanError("plan: expected a JSON object")
        try:
            plan = cls(
                version=int(d.get("version", -1)),
                model=ModelSpec.from_dict(d["model"]),
                world_size=int(d["world_size"]),
                batch_size_per_rank=int(d["batch_size_per_rank"]),
                packs=[PackPlan(**p) for p in d["packs"]],
                hot_rows={k: int(v) for k, v in d.get("hot_rows", {}).items()},
                hot_ids_file=d.get("hot_ids_file"),
                micro_batches=int(d.get("micro_batches", 1)),
                kernel_interleaving=bool(d.get("kernel_interleaving", False)),
                optimizer=OptimizerPlan(**d.get("optimizer", {})),
                hardware=d.get("hardware"),
                seed=int(d.get("seed", 0)),
                notes=dict(d.get("notes", {})),
            )
        except KeyError as exc:
            raise PlanError(f"plan: missing field {exc.args[0]!r}") from None
        except TypeError as exc:
            raise PlanError(f"plan: {exc}") from None
        plan.validate()
        return plan

    def save(self, path: str | os.PathLike, hot_ids: dict[str, np.ndarray] | None = None) -> None:
        """Write the plan (and its hot-ID file) atomically: temp file, then rename."""
        path = Path(path)
        if hot_ids is not None:
            self.hot_ids_file = path.with_suffix(".hot.npz").name
            atomic_write_bytes(path.with_suffix(".hot.npz"), _npz_bytes(hot_ids))
        self.validate()
        atomic_write_bytes(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanError(f"{path}: no such plan file") from None
        except json.JSONDecodeError as exc:
            raise PlanError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        plan = cls.from_dict(d)
        plan.notes.setdefault("_path", str(path))
        return plan

    def load_hot_ids(self, plan_path: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
        """Hot rows per table (table-local, hottest first), checked against hot_rows."""
        if not self.hot_ids_file:
            return {}
        base = Path(plan_path or self.notes.get("_path", ".")).parent
        f = base / self.hot_ids_file
        try:
            with np.load(f) as z:
                ids = {k: np.asarray(z[k], dtype=np.int64) for k in z.files}
        except FileNotFoundError:
            raise PlanError(f"{f}: hot-ID file named by the plan does not exist") from None
        out = {}
        for t, n in self.hot_rows.items():
            if n == 0:
                continue
            if t not in ids or len(ids[t]) < n:
                raise PlanError(f"{f}: table {t} needs {n} hot IDs, file has {len(ids.get(t, []))}")
            rows = ids[t][:n]
            if len(np.unique(rows)) != n or rows.min() < 0 or rows.max() >= self.model.table(t).num_rows:
                raise PlanError(f"{f}: hot IDs of table {t} must be distinct rows of the table")
            out[t] = rows
        return out


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})
    return buf.getvalue()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write to a temp file in the same folder, fsync, then rename over `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; plans are ordinary files
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
