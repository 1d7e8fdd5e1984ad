"""Rank 0's `RunResult` of a finished `RankRun` (executor.run.worker), built part by part."""

from __future__ import annotations

from typing import Any, Protocol

import torch
import torch.distributed as dist

from executor.run.config import RunConfig
from executor.run.cuda_graph import Stepper, graph_note, refusal
from executor.run.result import DataRead, Evaluation, PeakMemory, RunResult, Verify
from executor.run.sources import DataSource
from executor.run.verify import default_tolerance
from executor.sparse.exchange_check import exchange_report
from executor.step.timing import percentiles
from executor.step.trainer import Trainer
from planner.access import assumed
from planner.plan import Plan
from simulator.timeline import Timeline


class FinishedRun(Protocol):
    """What a finished rank's run (executor.run.worker.RankRun) holds for its result."""

    cfg: RunConfig
    plan: Plan
    world: int
    device: torch.device
    trainer: Trainer
    stepper: Stepper
    source: DataSource
    evaluator: Any  # executor.run.evaluate.Evaluator, or None
    op_timing: bool
    steps: int
    start_step: int
    warmup: int
    resumed: dict | None
    times: list[float]  # this rank's timed steps' seconds
    loss_values: list[float]
    total_s: float  # the slowest rank's timed seconds
    loss_sum: float  # over every rank's timed steps
    reports: list  # every rank's RankReport
    malformed: tuple[int, str]


def rank0_result(run: FinishedRun, verify: dict | None) -> RunResult:
    """The result, with the measured trace and Timeline written where the config asks."""
    cfg, plan, g = run.cfg, run.plan, run.plan.global_batch
    timed = len(run.times)
    samples = (g * timed / run.total_s) if timed and run.total_s > 0 else 0.0
    res = RunResult(
        plan=str(cfg.plan), model=plan.model.name, world_size=run.world,
        backend=dist.get_backend() if run.world > 1 else "none", device=str(run.device), global_batch=g,
        micro_batches=plan.micro_batches, dense_dtype=run.trainer.precision.used,
        dense_dtype_note=run.trainer.precision.note, steps=run.steps, timed_steps=timed,
        start_step=run.start_step, samples_per_s=samples,
        iteration_ms={k: v * 1e3 for k, v in percentiles(run.times).items()},
        step_ms=[t * 1e3 for t in run.times], mean_loss=run.loss_sum / timed if timed else None,
        last_loss_rank0_share=run.loss_values[-1] if run.loss_values else None, op_timing=run.op_timing,
        data=_data_read(run), peak_memory=_peak_memory(run), resumed=run.resumed,
        eval=[Evaluation(**{k: v for k, v in e.items() if k != "trace_us"}) for e in _evaluations(run)],
        cuda_graph_note=graph_note(run.stepper, cfg.cuda_graph, refusal(plan, run.device, run.op_timing)),
        input_wait=_input_wait(run), verify=_verify(run, verify),
        checkpoint=str(cfg.checkpoint) if cfg.checkpoint else None,
    )
    pred = _predicted_samples_per_s(run)
    if pred:
        res.predicted_samples_per_s, res.measured_over_predicted_samples = pred, samples / pred
    reports = run.reports
    if all(x.cpu_s is not None for x in reports):  # CPU time per step: what the step costs where compute is shared
        res.cpu_ms_per_step_per_rank = [1e3 * x.cpu_s for x in reports]
    if any(x.exchanged for x in reports):  # ranks that exchanged: their cold rows against the plan's
        res.exchange, res.exchange_note = exchange_report(
            [x.exchanged for x in reports], plan.prediction.cold_per_mb if plan.prediction else {},
            assumed(plan.provenance.access_source), [p.name for p in plan.packs])
    _write_timeline(run, res)
    return res


def _predicted_samples_per_s(run: FinishedRun) -> float | None:
    """The planner's predicted throughput, when the plan carries a prediction."""
    p = run.plan.prediction
    if p is None:
        return None
    if p.samples_per_s:
        return p.samples_per_s
    from planner.throughput import samples_per_s

    return samples_per_s(run.plan, p.iteration_us)


def _evaluations(run: FinishedRun) -> list[dict]:
    return run.evaluator.history if run.evaluator is not None else []


def _data_read(run: FinishedRun) -> DataRead:
    cfg, src = run.cfg, run.source
    count, first = run.malformed
    return DataRead(path=str(cfg.data), kind=src.kind, steps_per_epoch=src.steps_per_epoch(), epochs=cfg.epochs,
                    malformed_rows_skipped=count, first_malformed=first or None, reading=src.reading,
                    note=src.note)


def _peak_memory(run: FinishedRun) -> PeakMemory:
    """Each rank's measured peak; `picasso run` adds the planner's prediction beside it."""
    peaks = [x.peak for x in run.reports]
    cuda = run.device.type == "cuda"
    return PeakMemory(measure="cuda max_memory_allocated" if cuda else "process RSS high-water mark",
                      measured_bytes_per_rank=[pk["device"] for pk in peaks],
                      host_rss_bytes_per_rank=[pk["host_rss"] for pk in peaks])


def _input_wait(run: FinishedRun) -> dict[str, list[float]]:
    """Time each rank's timed steps waited for their input, against their step time."""
    reports = run.reports
    return {"mean_ms_per_rank": [1e3 * sum(x.waits) / max(1, len(x.waits)) for x in reports],
            "fraction_of_step_per_rank": [sum(x.waits) / sum(x.times) if sum(x.times) > 0 else 0.0
                                          for x in reports]}


def _verify(run: FinishedRun, found: dict | None) -> Verify | None:
    if found is None:
        return None
    cfg = run.cfg
    tol = (cfg.verify_tolerance if cfg.verify_tolerance is not None
           else default_tolerance(run.plan.model, run.trainer.precision.used))
    passed = bool(found["max_rel_diff"] <= tol)  # NaN fails
    return Verify(**{**found, "tolerance": tol, "passed": passed, "from_step": run.start_step})


def _write_timeline(run: FinishedRun, res: RunResult) -> None:
    """Every rank's events as one measured Timeline: the per-op durations, and the trace and
    Timeline files the config names."""
    cfg, plan = run.cfg, run.plan
    tl = Timeline(meta={"source": "measured", "plan": str(cfg.plan), "world_size": run.world,
                        "hardware": plan.hardware, "device": str(run.device)})
    for x in run.reports:
        tl.events.extend(x.events)
    for e in _evaluations(run):  # AUC and logloss per evaluation
        tl.count(0, "eval", e["trace_us"], {"auc": e["auc"], "logloss": e["logloss"]}, step=e["step"], rows=e["rows"])
    if run.op_timing:
        from simulator.measured import drop_warmup, mean_op_durations

        res.op_durations_us = mean_op_durations(drop_warmup(tl, run.warmup))  # per step, as validate measures
    if cfg.trace:
        tl.save_chrome_trace(cfg.trace)
        res.trace = str(cfg.trace)
    if cfg.timeline:
        tl.save(cfg.timeline)
        res.timeline = str(cfg.timeline)
