"""The Plan: a versioned JSON document the planner writes and the executor runs.

Conventions every layer relies on:
- Packed rows: the tables of a pack are stacked in the pack's order; table t's row r is
  packed row `offset[t] + r` (`Plan.table_offsets`). Raw IDs map to rows as
  `id % num_rows`.
- Which rows and columns each shard of a pack holds, and which shard owns a row, is
  planner.geometry's (`Plan.geometry`): row-wise is cyclic over the pack's ranks, and
  table-row-wise is laid out and exchanged exactly as row-wise over the ranks of one node;
  only its fused pooled exchange differs (hierarchical: see planner.pooled_twrw).
- Hot rows are replicated on every rank: `hot_ids` (npz next to the plan, one int64
  array of table-local rows per table, hottest first) lists them; the cold partition
  still owns every row, hot rows there are simply never read.
- IDs on the wire (the ID and bag-length all-to-alls) are int32 when every packed row index
  of the pack fits (`wire_id_bytes`), as TorchRec's Criteo pipeline feeds int32 IDs and
  lengths; each side widens them to int64 once received.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from foundation import fields
from foundation.documents import read_json
from foundation.fields import FieldError
from foundation.files import atomic_write_bytes, check_output_path, regular_file
from foundation.npz import BoundedNpz, NpzError
from planner.errors import PlanError
from planner.geometry import ShardGeometry, geometry_kind, shard_geometry
from planner.model_spec import ModelSpec, TableSpec
from planner.modes import LEGACY_FUSED, Exchange, HotSync, Placement, PlanExchange, Scoring
from planner.sharding import POOLED_SHARDINGS, SHARDINGS, Sharding

PLAN_VERSION = 1
INT32_ROWS = 2**31  # packed row indices below this travel as int32


def wire_id_bytes(rows: int) -> int:
    """Bytes of one ID (or bag length) on the wire for a pack of `rows` packed rows."""
    return 4 if rows < INT32_ROWS else 8

SPARSE_OPTIMIZERS = ("sgd", "rowwise_adagrad")
DENSE_OPTIMIZERS = ("sgd", "adagrad", "adam")


@dataclass
class PackPlan:
    name: str
    tables: list[str]
    sharding: Sharding = Sharding.ROW_WISE  # a plain name is taken (and kept when unknown: validate says so)
    ranks: list[int] | None = None  # ranks holding shards; None means every rank
    placement: Placement = Placement.HBM  # where cold rows live: device memory or host memory over PCIe
    # how the hot rows' gradients are synchronised (HotSync); the planner picks the cheaper by
    # its cost model (planner.lowering.hot_sync_costs)
    hot_sync: HotSync = HotSync.DENSE
    # what crosses ranks for the cold lookups (Exchange; pooled: partial sums, added to the
    # locally pooled hot part). Planner: the cheaper by planner.exchange.exchange_costs
    exchange: Exchange = Exchange.ROWS

    def __post_init__(self) -> None:
        # plain names are taken; an unknown one is kept for validate to name
        self.sharding = _mode(Sharding, self.sharding)
        self.placement = _mode(Placement, self.placement)
        self.hot_sync = _mode(HotSync, self.hot_sync)
        self.exchange = _mode(Exchange, self.exchange)


def _mode(kind: type, value: Any) -> Any:
    """`value` as a member of the mode enum `kind` when it names one, else unchanged."""
    return kind(value) if isinstance(value, str) and value in kind.values() else value


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


def table_optimizer(plan: Plan, table: TableSpec) -> str:
    """The sparse optimizer a table trains with: its own when it names one other than the
    default (sgd), else the plan's. Planner (state bytes, update passes) and executor share it."""
    return table.optimizer if table.optimizer != "sgd" else plan.optimizer.sparse


# the shardings whose runs of packs exchange as one (TorchRec fuses a sharding type's tables
# into one lookup and one collective): as TorchRec's own plans run, and as the torchrec-like
# baseline is scored
FUSED_SHARDINGS: dict[PlanExchange | Scoring, tuple[Sharding, ...]] = {
    PlanExchange.TORCHREC: (Sharding.TABLE_WISE, Sharding.TABLE_ROW_WISE),
    Scoring.FUSED_TABLE_WISE: (Sharding.TABLE_WISE,)}


def fused_runs(plan: Plan, rule: PlanExchange | Scoring | None = None) -> list[list[PackPlan]]:
    """The runs of consecutive packs that exchange as one under `rule` (default: the plan's
    exchange): packs of a sharding in FUSED_SHARDINGS whose sharding, placement and tables'
    attributes are equal. A run may be one pack; packs of no run exchange on their own.
    Lowering scores each run as one exchange; the executor runs a run of pooled packs so
    (executor.sparse.pooled_flat)."""
    kinds = FUSED_SHARDINGS.get(plan.exchange if rule is None else rule, ())
    runs: list[list[PackPlan]] = []
    key = None
    for p in plan.packs:
        k = plan.model.table(p.tables[0]).attributes() + (p.placement, p.sharding)
        if p.sharding not in kinds:
            key = None
            continue
        if k == key:
            runs[-1].append(p)
        else:
            runs.append([p])
            key = k
    return runs


def pooled_at_owners(plan: Plan, pack: PackPlan) -> bool:
    """Whether a pack's owners pool its cold lookups as the plan runs (lowering scores it so, the
    executor runs it so): PackPlan.exchange pooled, on more than one rank. On one rank nothing
    crosses ranks and both exchanges are the same local lookup, run and scored as rows."""
    return pack.exchange == Exchange.POOLED and plan.world_size > 1


def fused_pooled_member(plan: Plan, pack: PackPlan) -> bool:
    """Whether a pack joins its plan's fused pooled exchange (PlanExchange.FUSED_POOLED,
    planner.pooled_twrw): a table-row-wise pack whose owners pool."""
    return (plan.exchange == PlanExchange.FUSED_POOLED and pooled_at_owners(plan, pack)
            and geometry_kind(pack.sharding).within_node)


@dataclass
class Provenance:
    """Where a plan came from. Reports (a run's too) and `picasso simulate`'s defaults read it; training does not."""

    planner: str | None = None  # "picasso.search" for the search's own choice
    baseline: str | None = None  # naive, torchrec-like, dp-hot-only, torchrec
    # how explain scores this baseline beside how it runs (planner.modes.Scoring); None: as it runs
    scoring: Scoring | None = None
    # whose executor it is scored on (planner.engines.Engine; None: picasso's): lowering applies its traits
    engine: str | None = None
    label: str | None = None  # the search candidate it is
    profile: str | None = None  # the access profile it was planned from (absolute path)
    profile_scale_to: int | None = None  # ... extrapolated to this many rows
    row_cap: int | None = None  # tables capped at this many rows
    hardware_overrides: list[str] = field(default_factory=list)  # --set on top of Plan.hardware
    access_source: list[str] = field(default_factory=list)  # measured, zipf, ... (planner.access)
    candidates_scored: int | None = None
    torchrec: dict[str, Any] | None = None  # TorchRec's planner: sharding types, approximations, planning_s


@dataclass
class Prediction:
    """What the planner predicted for the plan on Plan.hardware (the run sets its measurement beside it)."""

    iteration_us: float | None = None
    samples_per_s: float | None = None
    engine: str | None = None  # simpy or fast
    fast_iteration_us: float | None = None  # the fast evaluator's figure, when the engine was simpy
    speedups: dict[str, float | None] = field(default_factory=dict)  # over each baseline
    # per pack: cold rows (a pooled exchange: cold IDs) each rank sends per micro-batch
    # (planner.volumes' cold_unique); a run counts the same and sets its figure beside it
    cold_per_mb: dict[str, float] = field(default_factory=dict)


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
    # the next batch's ID exchange runs during this step (TorchRec's TrainPipelineSparseDist):
    # the executor prefetches it on a process group of its own, lowering moves it off the step
    input_pipeline: bool = False
    # with input_pipeline: the micro-batch after whose pooling the next batch's IDs are sent
    # (None: the last one). Early, they share the links with the step's own forward exchanges;
    # late, with its backward ones: which costs less depends on the plan (the search tries both)
    ids_after_mb: int | None = None
    # the dense gradients' all-reduce in buckets of this many MiB, launched during the last
    # micro-batch's backward on a process group of their own, as DDP does (planner.grad_buckets;
    # the last bucket travels with the hot rows' gradients after the packs' backward, on a second
    # group of its own, beside the packs' gradient exchange); 0: one all-reduce after the
    # backward, on the default group
    grad_bucket_mb: float = 0.0
    # with several micro-batches: the backward runs layer by layer over all of them (every
    # micro-batch's top MLP, then each one's interaction, gradient exchange and bottom MLP)
    # instead of micro-batch by micro-batch, so a layer's dense gradients are final, and
    # all-reduced, while the rest of the backward runs; every micro-batch's activations are
    # held until then. The same sums in the same order: the weights do not change
    backward_by_layer: bool = False
    optimizer: OptimizerPlan = field(default_factory=OptimizerPlan)
    hardware: str | None = None  # name of the hardware spec it was planned for
    seed: int = 0
    # how the plan's exchanges run, and are scored (PlanExchange; a baseline scored otherwise
    # says so in Provenance.scoring)
    exchange: PlanExchange = PlanExchange.PER_PACK
    provenance: Provenance = field(default_factory=Provenance)
    prediction: Prediction | None = None
    version: int = PLAN_VERSION
    # the file it was loaded from (hot IDs are found beside it); not part of the document
    path: Path | None = field(default=None, compare=False, repr=False)
    # the hot IDs of a plan made in memory and not saved yet: `save` writes them beside it
    hot_ids: dict[str, np.ndarray] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.exchange = _mode(PlanExchange, self.exchange)

    # ---- derived views -------------------------------------------------------------
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

    def geometry(self, pack: PackPlan) -> ShardGeometry:
        """Which rows and columns each shard of the pack holds (planner.geometry)."""
        return shard_geometry(pack.sharding, self.pack_rows(pack), self.model.table(pack.tables[0]).dim,
                              self.pack_ranks(pack), self.world_size)

    def fully_hot(self, pack: PackPlan) -> bool:
        """A rows-exchange pack whose hot set holds every row of every table: each rank reads all
        its lookups from its replica, so it exchanges no rows (the executor skips its
        all-to-alls, lowering has none) and its rows are synchronised with the hot rows."""
        return (geometry_kind(pack.sharding).owns_whole_rows and pack.exchange == Exchange.ROWS
                and all(self.hot_rows.get(t, 0) >= self.model.table(t).num_rows for t in pack.tables))

    def wire_id_bytes(self, pack: PackPlan) -> int:
        """Bytes per ID the pack's exchanges send (planner.volumes costs, the executor sends)."""
        return wire_id_bytes(self.pack_rows(pack))

    @property
    def global_batch(self) -> int:
        return self.batch_size_per_rank * self.world_size

    @property
    def overlapped(self) -> bool:
        """The executor launches every exchange asynchronously and issues the packs stage by
        stage (kernel interleaving, or several micro-batches); otherwise it runs them one
        after another. Lowering, memory and the trainer all follow this one rule."""
        return self.kernel_interleaving or self.micro_batches > 1

    @property
    def pipelines_inputs(self) -> bool:
        """The next step's IDs travel during this one (input_pipeline; one rank has no exchange
        to pipeline). Lowering, memory, the worker and the trainer follow this one rule."""
        return self.input_pipeline and self.world_size > 1

    @property
    def ids_launch_mb(self) -> int:
        """The micro-batch after whose pooling the next step's IDs go (ids_after_mb, else the
        last). Lowering and the trainer follow this one rule."""
        return self.micro_batches - 1 if self.ids_after_mb is None else self.ids_after_mb

    @property
    def layered_backward(self) -> bool:
        """The backward runs layer by layer over the micro-batches (backward_by_layer; one
        micro-batch has no other order). Lowering, memory and the trainer follow this one rule."""
        return self.backward_by_layer and self.micro_batches > 1

    @property
    def buckets_grads(self) -> bool:
        """The dense gradients go in buckets during the backward (grad_bucket_mb; one rank has
        nothing to all-reduce). Lowering and the trainer follow this one rule."""
        return self.grad_bucket_mb > 0 and self.world_size > 1

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
        if self.ids_after_mb is not None and not 0 <= self.ids_after_mb < self.micro_batches:
            raise PlanError(f"ids_after_mb={self.ids_after_mb} must name one of the "
                            f"{self.micro_batches} micro-batch(es): 0 to {self.micro_batches - 1}")
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
            p.placement = Placement.from_str(p.placement, f"pack {p.name}: placement")
            p.hot_sync = HotSync.from_str(p.hot_sync, f"pack {p.name}: hot_sync")
            p.exchange = Exchange.from_str(p.exchange, f"pack {p.name}: exchange")
            if p.exchange == Exchange.POOLED:
                self._check_pooled(p)
            ranks = self.pack_ranks(p)
            if not ranks or len(set(ranks)) != len(ranks) or any(not 0 <= r < self.world_size for r in ranks):
                raise PlanError(f"pack {p.name}: ranks {p.ranks} must be distinct ranks in [0, {self.world_size})")
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
            if why := geometry_kind(p.sharding).misfit(ranks, self.model.table(p.tables[0]).dim):
                raise PlanError(f"pack {p.name}: {why}")
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
        self.exchange = PlanExchange.from_str(self.exchange, "exchange")
        if self.provenance.scoring is not None:
            self.provenance.scoring = Scoring.from_str(self.provenance.scoring, "provenance.scoring")
        if self.exchange == PlanExchange.FUSED_POOLED:
            self._check_fused_pooled()
        if self.optimizer.dense not in DENSE_OPTIMIZERS:
            raise PlanError(f"dense optimizer {self.optimizer.dense!r} is not one of {list(DENSE_OPTIMIZERS)}")

    def _check_fused_pooled(self) -> None:
        """The fused pooled groups (planner.pooled_twrw) as the executor runs them: with overlap
        (every member hands in its part before any is waited for), each member row-wise over
        one whole node of g ranks, nodes of one size that divides the world."""
        if not self.overlapped:
            raise PlanError("exchange fused_pooled needs micro_batches > 1 or kernel_interleaving: the executor "
                            "launches a group's one collective once every member has sent its part")
        sizes = set()
        for p in self.packs:
            if not fused_pooled_member(self, p):
                continue
            r = self.pack_ranks(p)
            g = len(r)
            sizes.add(g)
            if r != list(range(r[0], r[0] + g)) or r[0] % g or self.world_size % g:
                raise PlanError(f"pack {p.name}: a fused pooled member must hold one whole node: ranks {r[0]}.."
                                f"{r[0] + g - 1} of nodes of {g} ranks, got {r}")
        if len(sizes) > 1:
            raise PlanError(f"exchange fused_pooled: members span nodes of different sizes {sorted(sizes)}")

    def _check_pooled(self, p: PackPlan) -> None:
        """A pooled exchange needs bags to pool and whole rows at each owner."""
        if p.sharding not in POOLED_SHARDINGS:
            raise PlanError(f"pack {p.name}: exchange pooled needs sharding {' or '.join(POOLED_SHARDINGS)}, "
                            f"not {p.sharding} (owners pool whole rows; a replica exchanges nothing)")
        seq = [t for t in p.tables if self.model.table(t).pooling == "none"]
        if seq:
            raise PlanError(f"pack {p.name}: exchange pooled needs pooled tables; {seq[0]} has pooling none "
                            "(a sequence keeps one vector per item: there is no bag to pool at the owner)")

    # ---- JSON --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items()
             if k not in ("model", "packs", "optimizer", "provenance", "prediction", "path", "hot_ids")}
        d["model"] = self.model.to_dict()
        d["packs"] = [asdict(p) for p in self.packs]
        d["optimizer"] = asdict(self.optimizer)
        d["provenance"] = {k: v for k, v in asdict(self.provenance).items() if v not in (None, [])}
        if self.prediction is not None:
            d["prediction"] = {k: v for k, v in asdict(self.prediction).items() if v is not None}
        return {"version": self.version, **{k: v for k, v in d.items() if k != "version"}}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Plan:
        """A plan from plain data, every field checked (PlanError names the field)."""
        try:
            plan = _plan_from_dict(d)
        except FieldError as exc:
            raise PlanError(str(exc)) from None
        plan.validate()
        return plan

    def save(self, path: str | os.PathLike, hot_ids: dict[str, np.ndarray] | None = None) -> None:
        """Write the plan (and its hot-ID file) atomically: temp file, then rename."""
        path = check_output_path(path)
        hot_ids = self.hot_ids if hot_ids is None else hot_ids
        if hot_ids is not None:
            self.hot_ids_file = path.with_suffix(".hot.npz").name
            atomic_write_bytes(path.with_suffix(".hot.npz"), _npz_bytes(hot_ids))
        self.validate()
        atomic_write_bytes(path, (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> Plan:
        path = Path(path)
        try:
            d = read_json(path, "plan file")  # bounded in size, nesting and numbers; any BOM
        except FileNotFoundError:
            raise PlanError(f"{path}: no such plan file") from None
        except json.JSONDecodeError as exc:
            raise PlanError(f"{path}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        except (OSError, ValueError) as exc:
            raise PlanError(str(exc)) from None
        try:
            plan = cls.from_dict(d)
        except PlanError as exc:
            raise PlanError(f"{path}: {exc}") from None
        plan.path = path
        return plan

    def load_hot_ids(self, plan_path: str | os.PathLike | None = None) -> dict[str, np.ndarray]:
        """Hot rows per table (table-local, hottest first), checked against hot_rows."""
        if not self.hot_ids_file:
            return {}
        base = Path(plan_path or self.path or ".").parent
        f = base / self.hot_ids_file
        ids = read_hot_ids(f)
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


def read_hot_ids(f: Path) -> dict[str, np.ndarray]:
    """A hot-ID file: an .npz of one 1-D integer array per table (no pickles, no other files)."""
    not_ours = f"{f}: not a picasso hot-ID file (expected an .npz of one integer array per table)"
    try:
        regular_file(f, "hot-ID file")
    except FileNotFoundError:
        raise PlanError(f"{f}: hot-ID file named by the plan does not exist") from None
    except (OSError, ValueError) as exc:
        raise PlanError(str(exc)) from None
    try:
        with BoundedNpz(f, "hot-ID file") as z:  # numbers only, no more than the file's bytes justify
            ids = {}
            for k in z.files:
                a = z[k]
                if a.ndim != 1 or a.dtype.kind not in "iu":
                    raise PlanError(f"{f}: table {k}: expected a 1-D integer array, got {a.dtype} of shape {a.shape}")
                ids[k] = a.astype(np.int64)
    except PlanError:
        raise
    except NpzError as exc:
        raise PlanError(f"{not_ours}: {str(exc).removeprefix(f'{f}: ')}") from None
    except Exception:  # noqa: BLE001 - zipfile, numpy and OS errors of a damaged file: one line
        raise PlanError(f"{not_ours}: damaged, truncated or another format") from None
    return ids

MAX_WORLD = fields.MAX_RANKS
MAX_BATCH = fields.MAX_BATCH
KNOWN_FIELDS = ("version", "model", "world_size", "batch_size_per_rank", "packs", "hot_rows", "hot_ids_file",
                "micro_batches", "kernel_interleaving", "input_pipeline", "ids_after_mb", "grad_bucket_mb",
                "backward_by_layer", "optimizer", "hardware", "seed", "exchange", "provenance",
                "prediction", "notes")
# plan files written before Provenance and Prediction kept both in a free-form "notes" object:
# its keys, read into the typed fields (others, such as "_path", never described the plan)
NOTE_PROVENANCE = ("planner", "baseline", "label", "profile", "profile_scale_to", "row_cap", "hardware_overrides",
                   "access_source", "candidates_scored", "torchrec")
NOTE_PREDICTION = {"predicted_iteration_us": "iteration_us", "predicted_samples_per_s": "samples_per_s",
                   "predicted_engine": "engine", "fast_iteration_us": "fast_iteration_us", "speedups": "speedups"}


def _plan_from_dict(d: object) -> Plan:
    """Types and ranges of every field of a plan (the one place they are checked)."""
    fields.mapping(d, "(top level)")
    unknown = sorted(set(d) - set(KNOWN_FIELDS))
    if unknown:
        raise FieldError(f"field {unknown[0]}: unknown; known: {list(KNOWN_FIELDS)}")
    for req in ("model", "world_size", "batch_size_per_rank", "packs"):
        if req not in d:
            raise FieldError(f"field {req}: missing")
    world = fields.integer(d["world_size"], "world_size", 1, MAX_WORLD)
    opt = fields.mapping(d.get("optimizer", {}), "optimizer")
    unknown = sorted(set(opt) - set(OptimizerPlan.__dataclass_fields__))
    if unknown:
        raise FieldError(f"field optimizer.{unknown[0]}: unknown; known: {list(OptimizerPlan.__dataclass_fields__)}")
    dflt = OptimizerPlan()
    if "notes" in d and ({"exchange", "provenance", "prediction"} & set(d)):
        raise FieldError("field notes: an old plan's notes beside exchange/provenance/prediction; keep one")
    if "notes" in d:
        exchange, prov, pred = _legacy_notes(d)
    else:
        exchange = fields.text(d.get("exchange", PlanExchange.PER_PACK), "exchange")
        prov = dict(fields.mapping(d.get("provenance", {}), "provenance"))
        if exchange == LEGACY_FUSED:  # run pack by pack, scored fused (planner.modes)
            exchange, prov = PlanExchange.PER_PACK, {"scoring": Scoring.FUSED_TABLE_WISE, **prov}
        exchange = PlanExchange.from_str(exchange, "field exchange")
        pred = d.get("prediction")
    hot = fields.mapping(d.get("hot_rows", {}), "hot_rows")
    hot_file = d.get("hot_ids_file")
    if hot_file is not None:
        hot_file = fields.file_name(hot_file, "hot_ids_file")
    hardware = d.get("hardware")
    return Plan(
        version=fields.integer(d.get("version", -1), "version"),
        model=ModelSpec.from_dict(d["model"], where="model"),
        world_size=world,
        batch_size_per_rank=fields.integer(d["batch_size_per_rank"], "batch_size_per_rank", 1, MAX_BATCH),
        packs=[_pack_from_dict(p, f"packs[{i}]", world) for i, p in enumerate(fields.sequence(d["packs"], "packs"))],
        hot_rows={fields.text(k, "hot_rows"): fields.integer(v, f"hot_rows.{k}", 0) for k, v in hot.items()},
        hot_ids_file=None if hot_file is None else fields.text(hot_file, "hot_ids_file"),
        micro_batches=fields.integer(d.get("micro_batches", 1), "micro_batches", 1, MAX_BATCH),
        kernel_interleaving=fields.boolean(d.get("kernel_interleaving", False), "kernel_interleaving"),
        input_pipeline=fields.boolean(d.get("input_pipeline", False), "input_pipeline"),
        ids_after_mb=None if d.get("ids_after_mb") is None else fields.integer(d["ids_after_mb"], "ids_after_mb", 0),
        grad_bucket_mb=fields.real(d.get("grad_bucket_mb", 0.0), "grad_bucket_mb", 0.0, 1e6),
        backward_by_layer=fields.boolean(d.get("backward_by_layer", False), "backward_by_layer"),
        optimizer=OptimizerPlan(
            sparse=fields.text(opt.get("sparse", dflt.sparse), "optimizer.sparse", SPARSE_OPTIMIZERS),
            sparse_lr=fields.real(opt.get("sparse_lr", dflt.sparse_lr), "optimizer.sparse_lr", 0.0, 1e6, lo_open=True),
            dense=fields.text(opt.get("dense", dflt.dense), "optimizer.dense", DENSE_OPTIMIZERS),
            dense_lr=fields.real(opt.get("dense_lr", dflt.dense_lr), "optimizer.dense_lr", 0.0, 1e6, lo_open=True),
            eps=fields.real(opt.get("eps", dflt.eps), "optimizer.eps", 0.0, 1.0, lo_open=True),
        ),
        hardware=None if hardware is None else fields.text(hardware, "hardware"),
        seed=fields.integer(d.get("seed", 0), "seed", 0, (1 << 63) - 1),
        exchange=exchange,
        provenance=_provenance(prov),
        prediction=None if pred is None else _prediction(pred),
    )


def _legacy_notes(d: dict) -> tuple[PlanExchange, dict, dict | None]:
    """(exchange, provenance, prediction) of a plan written with a "notes" object instead."""
    notes = fields.mapping(d["notes"], "notes")
    exchange = PlanExchange.TORCHREC if notes.get("exchange") == PlanExchange.TORCHREC else PlanExchange.PER_PACK
    prov = {k: notes[k] for k in NOTE_PROVENANCE if notes.get(k) is not None}
    if notes.get("fused_exchange") is True:  # run pack by pack, scored fused (planner.modes)
        prov["scoring"] = Scoring.FUSED_TABLE_WISE
    pred = {new: notes[old] for old, new in NOTE_PREDICTION.items() if notes.get(old) is not None}
    return exchange, prov, pred or None


def _engine(value: object, where: str) -> str:
    from planner.engines import Engine

    return Engine.from_str(value, where).value


def _provenance(d: dict) -> Provenance:
    unknown = sorted(set(d) - set(Provenance.__dataclass_fields__))
    if unknown:
        raise FieldError(f"field provenance.{unknown[0]}: unknown; known: {list(Provenance.__dataclass_fields__)}")

    def opt(key: str, check: Any) -> Any:
        return None if d.get(key) is None else check(d[key], f"provenance.{key}")

    return Provenance(
        planner=opt("planner", fields.text), baseline=opt("baseline", fields.text), label=opt("label", fields.text),
        scoring=opt("scoring", Scoring.from_str), engine=opt("engine", _engine),
        profile=opt("profile", fields.text), profile_scale_to=opt("profile_scale_to", fields.integer),
        row_cap=opt("row_cap", fields.integer),
        hardware_overrides=[fields.text(x, "provenance.hardware_overrides")
                            for x in fields.sequence(d.get("hardware_overrides", []), "provenance.hardware_overrides")],
        access_source=[fields.text(x, "provenance.access_source")
                       for x in fields.sequence(d.get("access_source", []), "provenance.access_source")],
        candidates_scored=opt("candidates_scored", fields.integer),
        torchrec=None if d.get("torchrec") is None else dict(fields.mapping(d["torchrec"], "provenance.torchrec")),
    )


def _prediction(d: object) -> Prediction:
    fields.mapping(d, "prediction")
    unknown = sorted(set(d) - set(Prediction.__dataclass_fields__))
    if unknown:
        raise FieldError(f"field prediction.{unknown[0]}: unknown; known: {list(Prediction.__dataclass_fields__)}")

    def num(key: str) -> float | None:
        v = d.get(key)
        return None if v is None else fields.real(v, f"prediction.{key}", 0.0, float("inf"))

    speedups = fields.mapping(d.get("speedups", {}), "prediction.speedups")
    return Prediction(
        iteration_us=num("iteration_us"), samples_per_s=num("samples_per_s"),
        engine=None if d.get("engine") is None else fields.text(d["engine"], "prediction.engine"),
        fast_iteration_us=num("fast_iteration_us"),
        speedups={fields.text(k, "prediction.speedups"):
                  None if v is None else fields.real(v, f"prediction.speedups.{k}", 0.0, float("inf"))
                  for k, v in speedups.items()},
        cold_per_mb={fields.text(k, "prediction.cold_per_mb"): fields.real(v, f"prediction.cold_per_mb.{k}", 0.0, float("inf"))
                     for k, v in fields.mapping(d.get("cold_per_mb", {}), "prediction.cold_per_mb").items()},
    )


def _pack_from_dict(p: object, where: str, world: int) -> PackPlan:
    fields.mapping(p, where)
    unknown = sorted(set(p) - set(PackPlan.__dataclass_fields__))
    if unknown:
        raise FieldError(f"field {where}.{unknown[0]}: unknown; known: {list(PackPlan.__dataclass_fields__)}")
    for req in ("name", "tables"):
        if req not in p:
            raise FieldError(f"field {where}.{req}: missing")
    ranks = p.get("ranks")
    return PackPlan(
        name=fields.text(p["name"], f"{where}.name"),
        tables=[fields.text(t, f"{where}.tables[{i}]") for i, t in enumerate(fields.sequence(p["tables"], f"{where}.tables"))],
        sharding=fields.text(p.get("sharding", Sharding.ROW_WISE), f"{where}.sharding", SHARDINGS),
        ranks=None if ranks is None else [fields.integer(r, f"{where}.ranks[{i}]", 0, world - 1)
                                          for i, r in enumerate(fields.sequence(ranks, f"{where}.ranks"))],
        placement=Placement.from_str(p.get("placement", Placement.HBM), f"field {where}.placement"),
        hot_sync=HotSync.from_str(p.get("hot_sync", HotSync.DENSE), f"field {where}.hot_sync"),
        exchange=Exchange.from_str(p.get("exchange", Exchange.ROWS), f"field {where}.exchange"),
    )


def _npz_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v, dtype=np.int64) for k, v in arrays.items()})
    return buf.getvalue()
