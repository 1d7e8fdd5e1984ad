"""TorchRec's own planner as a baseline, and picasso plans in TorchRec's terms.

TorchRec is optional (`pip install 'picasso[torchrec]'`) and imported only inside the
functions that need it. Both directions go through one neutral, JSON-ready form of a
TorchRec sharding plan, per table::

    {"sharding_type": "table_row_wise", "compute_kernel": "fused", "ranks": [8, 9, ...],
     "shards": [[row_offset, col_offset, rows, cols, rank], ...]}

- `torchrec_plan(model, hw, batch, access)`: runs `EmbeddingShardingPlanner` on device
  `meta` with a `Topology` built from the hardware spec, and converts its ShardingPlan.
- `plan_from_torchrec(...)`: neutral form -> picasso Plan. Tables of one attribute group
  and one placement become one pack per (sharding, ranks), as TorchRec fuses them into one
  lookup kernel; the plan is scored as TorchRec runs it (PlanExchange.TORCHREC).
- `torchrec_sharding(plan)`: picasso Plan -> neutral form plus the list of what TorchRec
  cannot express (`picasso export --torchrec`).

What a conversion approximates is listed, never dropped silently: TorchRec's row-wise
shards are contiguous row ranges, picasso's are cyclic (the same per-owner load for hashed
IDs); its column-wise shards may be uneven or repeat a rank, picasso splits the dim evenly
over distinct ranks; UVM (cached or not) becomes host placement.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from planner.access import TableAccess, table_access
from planner.errors import PlanError
from planner.geometry import ShardGeometry, geometry_kind, shard_geometry
from planner.grad_buckets import DDP_BUCKET_CAP_MB
from planner.model_spec import ModelSpec
from planner.modes import Exchange, Placement, PlanExchange
from planner.plan import POOLED_SHARDINGS, PackPlan, Plan, Provenance, model_optimizer
from planner.sharding import Sharding

if TYPE_CHECKING:  # types only: the seams' own classes, not loaded at import
    from simulator.hardware import HardwareSpec


INSTALL_HINT = ("TorchRec is not installed: pip install 'picasso[torchrec]' (CPU build: see docs/guide.md, "
                "'TorchRec baseline')")
# picasso sharding -> TorchRec sharding type: the same names, but data parallel for a replica
TO_TORCHREC = {s: s.value for s in Sharding} | {Sharding.REPLICATED: "data_parallel"}
# and back; TorchRec's table-column-wise and grid shards become column-wise (an approximation)
FROM_TORCHREC = {name: s for s, name in TO_TORCHREC.items()} | {
    "table_column_wise": Sharding.COLUMN_WISE, "grid_shard": Sharding.COLUMN_WISE}
HOST_KERNELS = ("fused_uvm", "fused_uvm_caching")
# pack order in a converted plan: TorchRec fuses each sharding type into one exchange, so
# the packs of one type are kept next to each other (planner.lowering fuses runs)
ORDER = (Sharding.REPLICATED, Sharding.TABLE_WISE, Sharding.COLUMN_WISE, Sharding.ROW_WISE, Sharding.TABLE_ROW_WISE)


def torchrec_problem() -> str | None:
    """Why TorchRec cannot be used on this machine, in one line; None when it can.

    An import that fails for any reason means unavailable: a TorchRec whose fbgemm_gpu
    cannot load its native library raises OSError or RuntimeError, not ImportError.
    """
    try:
        with quiet():
            import torchrec  # noqa: F401
    except ImportError:
        return INSTALL_HINT
    except Exception as exc:  # noqa: BLE001 - a broken optional install is an absent one
        first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
        return (f"TorchRec is installed but does not import here ({type(exc).__name__}: {first}); "
                "see README, 'TorchRec baseline'")
    return None


def torchrec_available() -> bool:
    return torchrec_problem() is None


def require_torchrec() -> None:
    problem = torchrec_problem()
    if problem is not None:
        raise PlanError(problem)


# ---- TorchRec's planner ----------------------------------------------------------------------


def run_torchrec_planner(model: ModelSpec, hw: HardwareSpec, batch: int,
                         access: dict[str, TableAccess] | None = None) -> tuple[dict[str, dict], float]:
    """TorchRec's EmbeddingShardingPlanner on `model` (device meta): (neutral plan, seconds)."""
    require_torchrec()
    access = access if access is not None else table_access(model)
    seq = [t.name for t in model.tables if t.pooling == "none"]
    if seq:
        raise PlanError(f"TorchRec baseline: sequence tables (pooling none) are not supported: {', '.join(seq)}")
    with quiet():
        return _torchrec_planner(model, hw, batch, access)


def _torchrec_planner(model: ModelSpec, hw: HardwareSpec, batch: int,
                      access: dict[str, TableAccess]) -> tuple[dict[str, dict], float]:
    import torch
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.distributed.planner.types import PlannerError
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    dtypes = {"fp32": DataType.FP32, "fp16": DataType.FP16, "bf16": DataType.BF16}
    configs = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.num_rows,
                                  feature_names=[t.name], data_type=dtypes[t.dtype],
                                  pooling=PoolingType.MEAN if t.pooling == "mean" else PoolingType.SUM)
               for t in model.tables]
    ebc = EmbeddingBagCollection(tables=configs, device=torch.device("meta"))
    g = hw.gpus_per_node
    # TorchRec's bandwidths are bytes per millisecond; its inter-host figure is per device
    topology = Topology(
        world_size=hw.world_size, local_world_size=g, compute_device="cuda" if hw.kind == "gpu" else "cpu",
        hbm_cap=int(hw.gpu.hbm_bytes), ddr_cap=int(hw.host.dram_bytes / g),
        hbm_mem_bw=hw.gpu.hbm_bw / 1e3, ddr_mem_bw=hw.host.dram_bw / g / 1e3, hbm_to_ddr_mem_bw=hw.pcie_bw / 1e3,
        intra_host_bw=hw.intra_bw() / 1e3, inter_host_bw=hw.nic_bw_per_device() / 1e3,
    )
    constraints = {t.name: ParameterConstraints(pooling_factors=[float(access[t.name].pooling)])
                   for t in model.tables}
    fused = {"optimizer": _fbgemm_optimizer(model)} if _fbgemm_optimizer(model) is not None else None
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch, constraints=constraints)
    t0 = time.perf_counter()
    try:
        sharding_plan = planner.plan(ebc, [EmbeddingBagCollectionSharder(fused_params=fused)])
    except PlannerError as exc:
        raise PlanError(f"TorchRec's planner found no plan: {str(exc).splitlines()[0]}") from None
    return describe_sharding_plan(sharding_plan), time.perf_counter() - t0


QUIET_LOGGERS = ("", "torchrec", "fbgemm_gpu")  # the root logger too: TorchRec logs through it in places


@contextmanager
def quiet() -> Iterator[None]:
    """TorchRec's and fbgemm's own warnings and log lines silenced while only their code runs
    (its import, its topology, its planner's dry run on meta tensors): they speak of TorchRec's
    internals, not of the user's input. Filters and levels are restored after."""
    import logging
    import warnings

    loggers = [logging.getLogger(n) for n in QUIET_LOGGERS]
    levels = [lg.level for lg in loggers]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for lg in loggers:
            lg.setLevel(logging.ERROR)
        try:
            yield
        finally:
            for lg, level in zip(loggers, levels):
                lg.setLevel(level)


def _fbgemm_optimizer(model: ModelSpec) -> Any:
    if not any(t.optimizer == "rowwise_adagrad" for t in model.tables):
        return None
    from fbgemm_gpu.split_embedding_configs import EmbOptimType

    return EmbOptimType.EXACT_ROWWISE_ADAGRAD


def describe_sharding_plan(sharding_plan: Any) -> dict[str, dict]:
    """A TorchRec ShardingPlan (one EmbeddingBagCollection) in the neutral form."""
    out: dict[str, dict] = {}
    for module_plan in sharding_plan.plan.values():
        for table, ps in module_plan.items():
            shards = []
            for s in (ps.sharding_spec.shards if ps.sharding_spec is not None else []):
                rank = s.placement.rank() if s.placement is not None else None
                shards.append([int(s.shard_offsets[0]), int(s.shard_offsets[1]), int(s.shard_sizes[0]),
                               int(s.shard_sizes[1]), rank])
            out[table] = {"sharding_type": str(ps.sharding_type), "compute_kernel": str(ps.compute_kernel),
                          "ranks": [int(r) for r in ps.ranks] if ps.ranks is not None else None, "shards": shards}
    return out


def torchrec_plan(model: ModelSpec, hw: HardwareSpec, batch: int, access: dict[str, TableAccess] | None = None) -> Plan:
    """TorchRec's plan for `model` on `hw` as a picasso Plan (see the module docstring)."""
    neutral, seconds = run_torchrec_planner(model, hw, batch, access)
    plan = plan_from_torchrec(model, hw.world_size, batch, neutral, getattr(hw, "name", None))
    plan.provenance.torchrec["planning_s"] = round(seconds, 3)
    return plan


# ---- neutral form -> picasso Plan ------------------------------------------------------------


def plan_from_torchrec(model: ModelSpec, world: int, batch: int, neutral: dict[str, dict],
                       hw_name: str | None = None) -> Plan:
    """A picasso Plan with TorchRec's per-table choices; its provenance lists what was approximated."""
    missing = [t for t in model.table_names if t not in neutral]
    if missing:
        raise PlanError(f"TorchRec plan: no sharding for table(s) {', '.join(missing)}")
    groups: dict[tuple, list[str]] = defaultdict(list)
    approx: list[str] = []
    kinds: dict[str, int] = defaultdict(int)
    for t in model.tables:
        d = neutral[t.name]
        st, kernel = d["sharding_type"], d["compute_kernel"]
        if st not in FROM_TORCHREC:
            raise PlanError(f"TorchRec plan: table {t.name}: sharding type {st!r} is not one of {sorted(FROM_TORCHREC)}")
        kinds[st] += 1
        sharding = FROM_TORCHREC[st]
        kind = geometry_kind(sharding)
        ranks = _ranks(t.name, d, world)
        if not kind.is_partitioned:
            ranks = None
        elif sharding == Sharding.TABLE_WISE:
            ranks = ranks[:1]
        elif sharding == Sharding.ROW_WISE and sorted(ranks) == list(range(world)):
            ranks = None
        elif kind.splits_columns:
            distinct = list(dict.fromkeys(ranks))[: t.dim]
            if st != TO_TORCHREC[sharding] or len(distinct) != len(ranks) or not _even_columns(d, kind, t.dim):
                approx.append(f"{t.name}: {st} shards {_shape(d)} -> {sharding} split evenly over ranks {distinct}")
            ranks = distinct
        if kind.splits_rows and d.get("shards") and len(d["shards"]) > 1:
            approx.append(f"{t.name}: {st} contiguous row ranges -> cyclic rows over the same ranks")
        placement = Placement.HOST if kernel in HOST_KERNELS else Placement.HBM
        if kernel == "fused_uvm_caching":
            approx.append(f"{t.name}: {kernel} (HBM cache over UVM) -> cold rows in host memory, no cache")
        # one pack per fused group; column-wise tables are sharded alone
        key = (ORDER.index(sharding), tuple(ranks or ()), t.attributes(), placement,
               t.name if kind.splits_columns else "")
        groups[key].append(t.name)
    packs = []
    for i, (key, names) in enumerate(sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1], str(kv[0][2:])))):
        sharding, ranks, placement = ORDER[key[0]], list(key[1]) or None, key[3]
        pack = PackPlan(f"tr{i}_{sharding}", names, sharding, ranks, placement)
        # TorchRec pools at the owner: the executor runs the converted plan so where it can
        # (column-wise shards and data-parallel tables keep the rows exchange)
        if world > 1 and sharding in POOLED_SHARDINGS and all(model.table(n).pooling != "none" for n in names):
            pack.exchange = Exchange.POOLED
        packs.append(pack)
    plan = Plan(model=model, world_size=world, batch_size_per_rank=batch, packs=packs, hardware=hw_name,
                optimizer=model_optimizer(model), input_pipeline=world > 1,  # TrainPipelineSparseDist, run so too
                grad_bucket_mb=DDP_BUCKET_CAP_MB if world > 1 else 0.0,  # DMP's DDP, run so too
                exchange=PlanExchange.TORCHREC, provenance=Provenance(
                    baseline="torchrec", engine="torchrec",  # FBGEMM's TBE: backward and optimizer fused (planner.engines)
                    torchrec={"sharding_types": dict(kinds), "approximations": approx}))
    plan.validate()
    return plan


def _ranks(table: str, d: dict, world: int) -> list[int]:
    ranks = d.get("ranks") or [s[4] for s in d.get("shards", []) if s[4] is not None]
    if d["sharding_type"] == "data_parallel":
        return list(range(world))
    if not ranks:
        raise PlanError(f"TorchRec plan: table {table}: no ranks")
    bad = [r for r in ranks if not 0 <= int(r) < world]
    if bad:
        raise PlanError(f"TorchRec plan: table {table}: rank {bad[0]} is outside [0, {world})")
    return [int(r) for r in ranks]


def _even_columns(d: dict, kind: type[ShardGeometry], dim: int) -> bool:
    """Whether TorchRec's column shards are the ones picasso's geometry gives as many ranks."""
    cols = [s[3] for s in d.get("shards", [])]
    return not cols or cols == [s.cols for s in kind(0, dim, tuple(range(len(cols)))).shards]


def _shape(d: dict) -> str:
    return "x".join(str(s[3]) for s in d.get("shards", [])) or "?"


# ---- picasso Plan -> neutral form ------------------------------------------------------------


def torchrec_sharding(plan: Plan) -> tuple[dict[str, dict], list[str]]:
    """(per-table TorchRec sharding in the neutral form, what TorchRec cannot express)."""
    out: dict[str, dict] = {}
    lost: list[str] = []
    for p in plan.packs:
        if len(p.tables) > 1:
            lost.append(f"pack {p.name}: {len(p.tables)} tables packed into one table with row offsets "
                        "(TorchRec fuses lookups of a group but keeps tables apart)")
        geo = plan.geometry(p)
        ranks = list(geo.ranks)
        kernel = "dense" if not geo.is_partitioned else "fused_uvm" if p.placement == Placement.HOST else "fused"
        for t in p.tables:
            spec = plan.model.table(t)
            rows, dim = spec.num_rows, spec.dim
            table = shard_geometry(p.sharding, rows, dim, ranks, plan.world_size)
            if not table.is_partitioned:  # a data-parallel table: no shards
                shards = []
            elif table.splits_rows:  # TorchRec's contiguous ranges of even size
                per = -(-rows // len(ranks))
                shards = [[i * per, 0, max(0, min(per, rows - i * per)), dim, r] for i, r in enumerate(ranks)]
            else:  # [row offset, column offset, rows, columns, rank]
                shards = [[s.row_offset, s.col_offset, s.rows, s.cols, s.rank] for s in table.shards]
            out[t] = {"sharding_type": TO_TORCHREC[p.sharding], "compute_kernel": kernel, "ranks": ranks,
                      "shards": shards}
        if geo.splits_rows and len(ranks) > 1:
            lost.append(f"pack {p.name}: cyclic row ownership -> contiguous row ranges over the same ranks")
        if p.exchange == Exchange.ROWS and geo.is_partitioned and plan.world_size > 1:
            lost.append(f"pack {p.name}: exchange of deduplicated rows (TorchRec always pools at the owner: "
                        "exchange pooled)")
    hot = {t: n for t, n in plan.hot_rows.items() if n}
    if hot:
        lost.append(f"hot-row replication of {len(hot)} table(s) ({sum(hot.values()):,} rows): no TorchRec "
                    "equivalent (a UVM cache is per rank, not replicated)")
    if plan.micro_batches > 1:
        lost.append(f"{plan.micro_batches} micro-batches (data interleaving)")
    if plan.kernel_interleaving:
        lost.append("kernel interleaving of packs")
    if plan.world_size > 1 and plan.grad_bucket_mb != DDP_BUCKET_CAP_MB:
        # not part of a sharding plan: DDP's own setting, which TorchRec's DMP leaves at its default
        lost.append(f"dense gradients in {plan.grad_bucket_mb:g} MiB buckets, the last on a group of its own "
                    f"(set DDP's bucket_cap_mb={plan.grad_bucket_mb:g} through DMP's data-parallel wrapper)"
                    if plan.grad_bucket_mb > 0 else
                    "one dense all-reduce after the backward (DDP always buckets: 25 MiB in TorchRec's DMP)")
    return out, lost


def to_torchrec_objects(neutral: dict[str, dict], local_world_size: int) -> tuple[dict[str, Any], Any]:
    """(ParameterConstraints per table, ShardingPlan) built with TorchRec from the neutral form."""
    require_torchrec()
    with quiet():
        return _torchrec_objects(neutral, local_world_size)


def _torchrec_objects(neutral: dict[str, dict], local_world_size: int) -> tuple[dict[str, Any], Any]:
    from torch.distributed._shard.sharding_spec import EnumerableShardingSpec, ShardMetadata
    from torchrec.distributed.planner import ParameterConstraints
    from torchrec.distributed.types import EmbeddingModuleShardingPlan, ParameterSharding, ShardingPlan

    constraints, module_plan = {}, EmbeddingModuleShardingPlan()
    for t, d in neutral.items():
        constraints[t] = ParameterConstraints(sharding_types=[d["sharding_type"]], compute_kernels=[d["compute_kernel"]])
        spec = None
        if d["shards"]:
            spec = EnumerableShardingSpec([ShardMetadata(shard_offsets=[s[0], s[1]], shard_sizes=[s[2], s[3]],
                                                         placement=f"rank:{s[4]}/cuda:{s[4] % local_world_size}") for s in d["shards"]])
        module_plan[t] = ParameterSharding(sharding_type=d["sharding_type"], compute_kernel=d["compute_kernel"],
                                           ranks=d["ranks"], sharding_spec=spec)
    return constraints, ShardingPlan({"": module_plan})
