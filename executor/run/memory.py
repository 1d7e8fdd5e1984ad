"""A run's memory check: the planner's predicted peak per rank against this machine,
before any rank starts, and the measured peaks set beside the prediction afterwards."""

from __future__ import annotations

import gzip
import os
from pathlib import Path

from executor.run.result import RunResult
from planner.errors import PlanError
from planner.memory import (
    CPU_RUNTIME,
    GPU_RESERVE,
    INPUT_READER,
    gib,
    parsed_row_bytes,
    preload_input_bytes,
    run_memory,
)
from planner.plan import Plan

SAMPLE_BYTES = 1 << 20


def available_ram() -> int:
    """RAM the OS can hand out now (MemAvailable): other jobs on the machine count."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")


def estimate_rows(path: str, fmt: str) -> float:
    """Rows of a data file without reading it: Parquet metadata, else lines per byte of its
    first MiB (compressed bytes for gzip) times its size."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        return float(pq.ParquetFile(path).metadata.num_rows)
    size = Path(path).stat().st_size
    if path.endswith(".gz"):
        with open(path, "rb") as raw, gzip.GzipFile(fileobj=raw) as f:
            lines = f.read(SAMPLE_BYTES).count(b"\n")
            used = raw.tell()
    else:
        with open(path, "rb") as f:
            sample = f.read(SAMPLE_BYTES)
        lines, used = sample.count(b"\n"), len(sample)
    return size * lines / max(used, 1)


def predicted_peaks(plan: Plan, device_kind: str, data: str, fmt: str, preload: bool, steps: int,
                    verify: bool, resumed: bool = False) -> dict:
    """The planner's peak per rank for this run (input mode and --verify included)."""
    input_bytes = None
    if data == "synthetic":  # the workers generate 8 global batches of rows
        m = plan.model
        input_bytes = 8 * plan.global_batch * parsed_row_bytes(m.num_dense, len(m.tables)) * 2
    elif preload:
        from traces.dataset import Dataset, is_dataset

        rows = float(Dataset(data).rows) if is_dataset(data) else estimate_rows(data, fmt)  # a converted folder
        input_bytes = preload_input_bytes(plan, rows, steps)
    report = run_memory(plan, device_kind, input_bytes)
    peaks = [float(x) for x in report.rank_peak]
    out = {"predicted_bytes_per_rank": peaks, "by_component": report.to_dict()["hbm_by_component"]}
    if device_kind == "cuda":  # a GPU rank's RAM: the process, its input, host-placed tables
        inp = INPUT_READER if input_bytes is None else input_bytes
        out["predicted_host_bytes_per_rank"] = [float(h) + CPU_RUNTIME + inp for h in report.host_total]
    if verify:
        from executor.run.reference import reference_bytes

        cost = reference_bytes(plan, steps, resumed)
        out["verify_reference_bytes"] = cost
        if device_kind == "cpu":  # the reference lives in rank 0's RAM
            out["predicted_bytes_per_rank_with_verify"] = [peaks[0] + cost, *peaks[1:]]
    return out


def check_fits(pred: dict, device_kind: str, local_ranks: range, verify: bool) -> None:
    """Refuse (PlanError, one line) when the local ranks' predicted peaks exceed this machine."""
    peaks = pred.get("predicted_bytes_per_rank_with_verify") or pred["predicted_bytes_per_rank"]
    verify_note = (f" (--verify's reference on rank 0: {gib(pred['verify_reference_bytes'])})"
                   if verify and "verify_reference_bytes" in pred else "")
    if device_kind == "cuda":
        import torch

        for i, r in enumerate(local_ranks):
            cap = torch.cuda.get_device_properties(i % torch.cuda.device_count()).total_memory
            need = peaks[r] + GPU_RESERVE  # the CUDA context and allocator slack are not in the peak
            if need > cap:
                raise PlanError(f"rank {r} is predicted to need {gib(need)} of GPU memory, GPU {i} has "
                                f"{gib(cap)}: short by {gib(need - cap)}")
        peaks = list(pred["predicted_host_bytes_per_rank"])
        if verify and "verify_reference_bytes" in pred:  # the reference runs in rank 0's RAM
            peaks[local_ranks[0]] += pred["verify_reference_bytes"]
    avail = available_ram()
    total = 0.0
    for r in local_ranks:  # the local ranks share this machine's RAM
        total += peaks[r]
        if total > avail:
            raise PlanError(
                f"rank {r} does not fit in this machine's RAM: ranks {local_ranks[0]}..{r} are predicted to need "
                f"{gib(total)}, {gib(avail)} is available: short by {gib(total - avail)}{verify_note}"
            )


def attach_measured(result: RunResult, pred: dict) -> None:
    """Set the prediction beside the measured peaks in the run's result."""
    pm = result.peak_memory
    pm.predicted_bytes_per_rank = pred["predicted_bytes_per_rank"]
    pm.by_component = pred["by_component"]
    pm.predicted_host_bytes_per_rank = pred.get("predicted_host_bytes_per_rank")
    pm.verify_reference_bytes = pred.get("verify_reference_bytes")
    pm.predicted_bytes_per_rank_with_verify = pred.get("predicted_bytes_per_rank_with_verify")
    want = pred.get("predicted_bytes_per_rank_with_verify") or pred["predicted_bytes_per_rank"]
    pm.measured_over_predicted = [m / p if p else None for m, p in zip(pm.measured_bytes_per_rank, want)]
