"""Peak memory per rank of a plan: the one rule the planner's fit check, `picasso plan
--explain`, `picasso run`'s refusal and its measured-vs-predicted report all use.

Components per rank (bytes, numpy arrays of length world_size):
- persistent: table shards and their optimizer state, the hot cache (weights, gradient,
  state, the gradient's copy in the flat all-reduce buffer), the hot-row index (one int64
  per packed row of a pack that has hot rows), the dense model (weights, gradients,
  optimizer state, flat all-reduce copy), and on CPU the process itself (Python, torch,
  gloo: `runtime`);
- while training: activations, exchange buffers, the input pipeline;
- while starting: the packed-row index of the pack being initialised (int64 per local row;
  the rows themselves are streamed in chunks, executor.sparse.layout).
The peak is the larger of the two phases. On a CPU "device" (one worker process) the
host components live in the same RAM, so the process's RSS peak is device + host.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.dense import DenseCost, dense_cost
from planner.modes import Placement
from planner.plan import Plan
from planner.volumes import ID_BYTES, PackVolumes, pack_volumes

DENSE_STATES = {"sgd": 0, "adagrad": 1, "adam": 2}
GPU_RESERVE = 1 << 30  # CUDA context, allocator slack, NCCL buffers (not in max_memory_allocated)
# A CPU worker before it holds any table: Python, torch, numpy, pyarrow and a gloo group
# (measured 234 MiB with torch 2.13 CPU), plus the first step's autograd and allocator
# workspace (30-50 MiB at 256-1024 rows per rank).
CPU_RUNTIME = 272 << 20
# The streaming reader: two 16 MiB text blocks in flight, their parsed columns, pyarrow's
# pool and 4 prepared batches (measured 232 MiB reading Criteo TSV).
INPUT_READER = 240 << 20
PRELOAD_COPIES = 2  # --preload holds the parsed file and, while concatenating, its chunks


def parsed_row_bytes(num_dense: int, num_sparse: int) -> int:
    """Bytes of one parsed input row: float32 label and dense features, int64 IDs."""
    return 4 + 4 * num_dense + ID_BYTES * num_sparse


@dataclass
class MemoryReport:
    """Peak bytes per rank by component, and the capacity it must fit in."""

    hbm: dict[str, np.ndarray]  # component -> bytes per rank (device; on CPU the worker's RAM)
    host: dict[str, np.ndarray]
    hbm_capacity: float
    host_capacity: float  # per rank (node DRAM / devices per node)
    kind: str = "gpu"
    init_extra: np.ndarray = field(default_factory=lambda: np.zeros(1))  # start-up transient
    training_only: tuple[str, ...] = ("activations", "buffers", "input")

    @property
    def hbm_total(self) -> np.ndarray:
        """Device peak per rank: the larger of training and start-up."""
        train = sum(self.hbm.values())
        init = sum(v for k, v in self.hbm.items() if k not in self.training_only) + self.init_extra
        return np.maximum(train, init)

    @property
    def host_total(self) -> np.ndarray:
        return sum(self.host.values())

    @property
    def rank_peak(self) -> np.ndarray:
        """What a rank's measured peak is compared with: on CPU the worker's RSS (device and
        host are one RAM), on GPU torch's allocated peak (the reserve is not allocated by torch)."""
        if self.kind == "cpu":
            return self.hbm_total + self.host_total
        return self.hbm_total - self.hbm.get("reserve", 0.0)

    def fits(self) -> bool:
        return bool(self.hbm_total.max() <= self.hbm_capacity and self.host_total.max() <= self.host_capacity)

    def problem(self) -> str | None:
        """One line naming the rank and the excess, or None when the plan fits."""
        for what, total, cap in (("device memory", self.hbm_total, self.hbm_capacity),
                                 ("host memory", self.host_total, self.host_capacity)):
            r = int(np.argmax(total))
            if total[r] > cap:
                return (f"plan does not fit in {what}: rank {r} needs {gib(total[r])} but has "
                        f"{gib(cap)} (over by {gib(total[r] - cap)})")
        return None

    def to_dict(self) -> dict:
        return {
            "hbm_capacity": self.hbm_capacity, "host_capacity": self.host_capacity,
            "hbm_peak": float(self.hbm_total.max()), "host_peak": float(self.host_total.max()),
            "hbm_by_component": {k: float(np.max(v)) for k, v in self.hbm.items()},
            "host_by_component": {k: float(np.max(v)) for k, v in self.host.items()},
            "hbm_per_rank": [float(x) for x in self.hbm_total],
            "init_transient": float(np.max(self.init_extra)),
            "rank_peak_per_rank": [float(x) for x in self.rank_peak],
        }


def gib(x: float) -> str:
    return f"{x / 2**30:.2f} GiB"


def memory_report(plan: Plan, packs: list[PackVolumes], hw, dense: DenseCost | None = None,
                  input_bytes: float | None = None) -> MemoryReport:
    """Peak memory per rank: tables, hot cache, optimizer state, activations, buffers, the
    process and its input. `input_bytes`: the input pipeline's bytes per rank when not the
    streaming reader's (see preload_input_bytes)."""
    world = plan.world_size
    dense = dense or dense_cost(plan.model)
    k = plan.micro_batches
    zeros = np.zeros(world)
    tables, hot, hot_index, host = zeros.copy(), zeros.copy(), zeros.copy(), zeros.copy()
    buffers, init_index = zeros.copy(), zeros.copy()
    for pv in packs:
        per_row = pv.slice_bytes + pv.state_bytes
        if not pv.geometry.is_partitioned:
            tables += pv.rows * (pv.row_bytes + pv.state_bytes)
            # the all-gathered sparse gradients of every rank
            buffers += pv.allgather_bytes(k) * world
        elif pv.placement == Placement.HOST:
            host += pv.shard_rows * per_row
        else:
            tables += pv.shard_rows * per_row
        # cache, its gradient (and that gradient's copy in the flat all-reduce), state
        # cache, its fp32 gradient and the gradient's copy in the flat all-reduce (none kept
        # whole under a sparse hot sync), state
        hot += pv.hot_rows * (pv.row_bytes + (0 if pv.sparse_hot else 2 * pv.grad_row_bytes) + pv.state_bytes)
        if pv.hot_rows:  # packed row -> hot slot, every row of the pack on every rank
            hot_index += pv.rows * ID_BYTES
        # the pack's local rows as int64 while its shard is initialised
        local = np.full(world, float(pv.rows)) if not pv.geometry.is_partitioned else np.ceil(pv.shard_rows)
        init_index = np.maximum(init_index, local * ID_BYTES)
        # exchange buffers of one micro-batch: ids out/in, rows out/in, gradients
        buffers += (pv.cold_unique * (ID_BYTES + 2 * pv.row_bytes) + pv.lookups * ID_BYTES * 3
                    + pv.recv_ids * (ID_BYTES + 2 * pv.slice_bytes))
        if pv.pooled:  # partial sums in and out, pooled gradients, the owner's per-ID gradients
            buffers += pv.pooled_out_bytes * 2 + pv.recv_ids * pv.grad_row_bytes
    if plan.overlapped:
        buffers *= 2  # two micro-batches / packs in flight
    if plan.pipelines_inputs:
        # the next step's lookups, routed and their IDs sent, held through this step
        buffers += sum(k * (pv.lookups * ID_BYTES * 3 + (pv.cold_unique + pv.recv_ids) * ID_BYTES) for pv in packs)
    samples = plan.batch_size_per_rank
    width = sum(pv.pooled_width for pv in packs)
    # pooled embeddings of every micro-batch wait for their dense step, and so do the bottom
    # MLP's activations (run for every micro-batch while the rows fly); the rest of the dense
    # activations live for one micro-batch at a time, or for all of them until a layered backward
    held = samples if plan.layered_backward else samples / k
    bottom = dense.ops["bottom_mlp"].act_bytes
    acts = samples * width * 4 * 2 + samples * bottom * 2 + held * (dense.act_bytes - bottom) * 2
    # weights, gradients, optimizer state and the gradients' copy in the flat all-reduce
    dense_bytes = dense.params * 4 * (3 + DENSE_STATES.get(plan.optimizer.dense, 0))
    cpu = hw.kind == "cpu"
    hbm = {
        "tables": tables, "hot_cache": hot, "hot_index": hot_index, "dense_model": zeros + dense_bytes,
        "activations": zeros + acts, "buffers": buffers,
        "input": zeros + ((INPUT_READER if input_bytes is None else input_bytes) if cpu else 0.0),
        "runtime": zeros + (CPU_RUNTIME if cpu else 0.0),
        "reserve": zeros + (0.0 if cpu else GPU_RESERVE),
    }
    host_cap = hw.host.dram_bytes / hw.gpus_per_node
    return MemoryReport(hbm=hbm, host={"cold_tables": host}, hbm_capacity=float(hw.gpu.hbm_bytes),
                        host_capacity=float(host_cap), kind=hw.kind, init_extra=init_index)


def preload_input_bytes(plan: Plan, data_rows: float, steps: int) -> float:
    """Input pipeline of `picasso run --preload`: the reader, the whole parsed file (twice
    while it is concatenated) and every step's prepared rows of this rank."""
    m = plan.model
    row = parsed_row_bytes(m.num_dense, len(m.tables))
    return INPUT_READER + PRELOAD_COPIES * data_rows * row + steps * plan.batch_size_per_rank * row


def run_memory(plan: Plan, device_kind: str, input_bytes: float | None = None) -> MemoryReport:
    """The memory report of `plan` as the executor runs it on a `device_kind` ("cpu" or
    "cuda") device: the plan's hardware and profile from its provenance where they still load
    (else local-cpu and the Zipf fallback: only capacities and exchange buffers use them)."""
    from dataclasses import replace
    from pathlib import Path

    from planner.access import table_access
    from simulator.hardware import load_hardware

    try:
        hw = load_hardware(plan.hardware or "local-cpu", list(plan.provenance.hardware_overrides))
    except (ValueError, OSError):
        hw = load_hardware("local-cpu")
    hw = replace(hw, kind="gpu" if device_kind == "cuda" else "cpu")
    profile = None
    path = plan.provenance.profile
    if path and Path(path).exists():
        from traces.extrapolate import scale_profile
        from traces.profile import AccessProfile

        try:
            profile = AccessProfile.load(path)
            if plan.provenance.profile_scale_to:
                profile = scale_profile(profile, plan.provenance.profile_scale_to)
        except (ValueError, OSError, KeyError):
            profile = None
    access = table_access(plan.model, profile)
    samples = plan.batch_size_per_rank / plan.micro_batches
    packs = [pack_volumes(plan, p, access, samples) for p in plan.packs]
    return memory_report(plan, packs, hw, input_bytes=input_bytes)
