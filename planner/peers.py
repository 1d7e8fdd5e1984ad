"""The plans the systems users compare with run, built as those systems build them, and marked
with the engine that runs them (Provenance.engine: lowering applies its traits, planner.engines).

- `nvidia-dlrm` (NVIDIA DeepLearningExamples PyTorch DLRM, dlrm/utils/distributed.py
  get_device_mapping): tables model-parallel, placed whole by a greedy size balance with at most
  ceil(tables / devices) per device; on more than 4 GPUs device 0 holds no table (it runs the
  bottom MLP for the global batch); every sample's pooled vectors exchanged by one all-to-all
  (BottomToTop); MLPs data-parallel; the tables' own optimizer (SGD as published).
- `hugectr` (HugeCTR hybrid embedding, as NVIDIA's MLPerf DLRM submissions run it): per table,
  the frequent categories are data-parallel on every GPU (their gradients all-reduced), the rest
  model-parallel, rows spread over every GPU and exchanged. A category is frequent when
  exchanging it for the global batch costs more than all-reducing its gradient: its expected
  lookups in a global batch times a vector's all-to-all cost exceed a row's all-reduce cost
  (HugeCTR hybrid_embedding statistics: frequent categories by the all-reduce/all-to-all
  bandwidths), within a quarter of device memory. Hybrid embedding takes one-hot slots (its
  sample indices are one category per slot); a multi-hot table has no frequent set.
- `torchrec`'s shape is TorchRec's planner (planner.torchrec_bridge, with TorchRec installed);
  without it, `torchrec-like` (planner.builders) scored on TorchRec's engine.
"""

from __future__ import annotations

import math

from planner.access import TableAccess
from planner.engines import Engine
from planner.errors import PlanError
from planner.model_spec import ModelSpec, attribute_groups
from planner.modes import PlanExchange
from planner.plan import PackPlan, Plan, Provenance, model_optimizer
from planner.sharding import Sharding
from planner.volumes import ID_BYTES
from simulator.hardware import HardwareSpec

NVIDIA_DLRM = "nvidia-dlrm"
HUGECTR = "hugectr"
PEERS = (NVIDIA_DLRM, HUGECTR)
# HugeCTR's hybrid embedding keeps its frequent rows within this share of a device's memory
FREQUENT_MEMORY_SHARE = 0.25


def nvidia_buckets(sizes: list[int], devices: int) -> list[list[int]]:
    """Table indices per device, as get_device_mapping's distribute_to_buckets places them: the
    largest table first into the least-filled device, a device full at ceil(tables / devices)."""
    cap = math.ceil(len(sizes) / devices)
    order = sorted(range(len(sizes)), key=lambda i: (-sizes[i], i))
    open_, full = [[] for _ in range(devices)], []
    for i in order:
        open_[0].append(i)
        if len(open_[0]) == cap:
            full.append(open_.pop(0))
        open_.sort(key=lambda b: sum(sizes[j] for j in b))
    return full + open_


def nvidia_dlrm_plan(model: ModelSpec, world: int, batch: int, hw_name: str | None = None) -> Plan:
    """NVIDIA's DLRM: whole tables per device, pooled vectors of every sample exchanged."""
    sizes = [t.num_rows * t.bytes_per_row for t in model.tables]
    # more than 4 GPUs: device 0 runs the bottom MLP and holds no table
    spread = [[]] + nvidia_buckets(sizes, world - 1) if world > 4 else nvidia_buckets(sizes, world)
    packs = []
    for rank, idx in enumerate(spread):
        for gi, group in enumerate(_groups_of(model, sorted(idx))):
            packs.append(PackPlan(f"r{rank}_g{gi}", group, Sharding.TABLE_WISE, [rank]))
    plan = Plan(model=model, world_size=world, batch_size_per_rank=batch, packs=packs, hardware=hw_name,
                provenance=Provenance(baseline=NVIDIA_DLRM, engine=Engine.NVIDIA_DLRM.value),
                optimizer=model_optimizer(model))
    plan.exchange = PlanExchange.TORCHREC  # every lookup's ID to its owner, pooled vectors back
    plan.validate()
    return plan


def _groups_of(model: ModelSpec, idx: list[int]) -> list[list[str]]:
    """Tables (by index) split by packing attributes, in model order."""
    out: dict[tuple, list[str]] = {}
    for i in idx:
        t = model.tables[i]
        out.setdefault(t.attributes(), []).append(t.name)
    return list(out.values())


def frequent_rows(model: ModelSpec, access: dict[str, TableAccess], world: int, batch: int,
                  hw: HardwareSpec | None) -> dict[str, int]:
    """HugeCTR's frequent categories per table (module docstring)."""
    if world <= 1 or hw is None:
        return {}
    from simulator.cost import collective_cost
    from simulator.opgraph import Collective

    group = tuple(range(world))
    n = 64e6  # bytes: latency terms vanish
    a2a = collective_cost(Collective("all_to_all", group, n), hw)[1] / n
    ar = collective_cost(Collective("all_reduce", group, n), hw)[1] / n
    sizes: dict[str, int] = {}
    for t in model.tables:
        acc = access[t.name]
        if float(acc.pooling) > 1.0 or t.pooling == "none":
            continue  # multi-hot: hybrid embedding takes one-hot slots only; exchanged whole
        lookups = batch * world * max(float(acc.pooling), 1e-9)
        # forward vector and backward gradient of each lookup, against the row's gradient all-reduce
        p_min = t.bytes_per_row * ar / (lookups * (2 * t.bytes_per_row + ID_BYTES) * a2a)
        rows = acc.rows_above(p_min) if p_min < 1.0 else 0
        if rows:
            sizes[t.name] = int(min(rows, t.num_rows))
    budget = FREQUENT_MEMORY_SHARE * float(hw.gpu.hbm_bytes)
    per_row = {t.name: 2 * t.bytes_per_row + t.state_bytes for t in model.tables}
    used = sum(n * per_row[name] for name, n in sizes.items())
    if used > budget:
        shrink = budget / used
        sizes = {k: int(v * shrink) for k, v in sizes.items() if int(v * shrink) > 0}
    return sizes


def hugectr_plan(model: ModelSpec, world: int, batch: int, hw: HardwareSpec | None,
                 access: dict[str, TableAccess], hw_name: str | None = None) -> Plan:
    """HugeCTR's hybrid embedding: frequent rows replicated, the rest row-wise and exchanged."""
    packs = [PackPlan(f"g{gi}_hybrid", [t.name for t in g], Sharding.ROW_WISE if world > 1 else Sharding.REPLICATED)
             for gi, g in enumerate(attribute_groups(model))]
    hot = frequent_rows(model, access, world, batch, hw)
    plan = Plan(model=model, world_size=world, batch_size_per_rank=batch, packs=packs, hot_rows=hot,
                hot_ids_file="hot.npz" if hot else None, hardware=hw_name,
                provenance=Provenance(baseline=HUGECTR, engine=Engine.HUGECTR.value),
                optimizer=model_optimizer(model))
    plan.validate()
    return plan


def peer_plan(name: str, model: ModelSpec, world: int, batch: int, hw: HardwareSpec | None,
              access: dict[str, TableAccess]) -> Plan:
    hw_name = getattr(hw, "name", None)
    if name == NVIDIA_DLRM:
        return nvidia_dlrm_plan(model, world, batch, hw_name)
    if name == HUGECTR:
        return hugectr_plan(model, world, batch, hw, access, hw_name)
    raise PlanError(f"unknown peer {name!r}; known: {', '.join(PEERS)}")
