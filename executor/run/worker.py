"""The worker a rank runs (`python -m executor ...`, started by executor.process.agent, torchrun or by hand).

It reads the plan, joins the process group (NCCL with CUDA, gloo otherwise, with a
timeout on collectives), streams its rows of each global batch from the data file in a
background thread, trains, times every op, and rank 0 writes the result JSON, the
Chrome trace / Timeline and, with --verify, the comparison with the reference.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

from executor.comm import Comm
from executor.data.batches import (
    BadRows,
    DataError,
    DeviceFeeder,
    Prefetcher,
    RowCount,
    dataset_batches,
    feature_map,
    global_batches,
    reader_chunks,
    rebatch,
    steps_per_epoch,
    synthetic_raw,
    to_batch,
    too_few_rows,
)
from executor.data.text_ranges import (
    TEXT_FORMATS,
    TextRanges,
    common_steps_per_epoch,
    range_chunks,
    splittable,
    whole_read_note,
)
from executor.process.allocator import HeapTrimmer
from executor.process.lines import say
from executor.process.memory import peak_bytes
from executor.process.process_tree import die_with_parent
from executor.process.rendezvous import join_store
from executor.process.threads import set_rank_threads
from executor.run.args import GraphMode, add_training_args
from executor.run.cuda_graph import graph_note, graph_stepper, refusal, untimed_steps
from executor.run.result import RunResult
from executor.run.verify import compare, default_tolerance, start_state
from executor.sparse import kernels
from executor.sparse.exchange_check import exchange_report
from executor.step.timing import LossLog, OpTimer, StepClock, percentiles
from executor.step.trainer import Trainer
from foundation.files import atomic_write_bytes
from planner.access import assumed
from planner.plan import Plan
from traces.dataset import Dataset, is_dataset


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m executor", description="run one rank of a picasso plan")
    p.add_argument("--plan", required=True, help="plan JSON")
    p.add_argument("--data", required=True, help="data file or glob, a converted dataset folder, or 'synthetic'")
    p.add_argument("--format", default="criteo", help="data format for traces.readers (criteo, avazu, ...)")
    p.add_argument("--synthetic-rows", type=int, default=0, help="rows of synthetic data (default: 4 global batches per step budget)")
    p.add_argument("--steps", type=int, default=20)
    add_training_args(p)
    p.add_argument("--preload", action="store_true",
                   help="read the data and prepare every batch before training (timings then exclude input preparation)")
    p.add_argument("--trace", help="write the measured Chrome trace here (rank 0)")
    p.add_argument("--timeline", help="write the measured Timeline JSON here (rank 0)")
    p.add_argument("--checkpoint", help="save a checkpoint here at the end")
    p.add_argument("--keep", type=int, default=2, help="checkpoint versions to keep in --checkpoint")
    p.add_argument("--resume", help="load this checkpoint before training (any plan/world size of the model)")
    p.add_argument("--verify", action="store_true", help="compare with the single-process reference (rank 0)")
    p.add_argument("--verify-tolerance", type=float, help="largest relative difference --verify accepts "
                   "(default: 1e-4 for fp32 dense layers, looser for tf32/bf16)")
    p.add_argument("--result", help="rank 0 writes the result JSON here")
    p.add_argument("--timeout", type=float, default=120.0, help="collective timeout in seconds")
    p.add_argument("--op-timing", action="store_true",
                   help="record per-op events (on with --trace/--timeline); without it only whole steps are timed")
    p.add_argument("--no-timing", action="store_true", help="never record per-op events")
    p.add_argument("--check-every", type=int, default=10,
                   help="read the losses back (and stop on a non-finite one) every N steps")
    return p


def setup(timeout: float) -> tuple[Comm, torch.device]:
    """Join the process group from executor.process.agent's (or torchrun's) environment, or run alone."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if cuda else "gloo", timeout=datetime.timedelta(seconds=timeout),
                                store=join_store(timeout), rank=int(os.environ.get("RANK", "0")), world_size=world)
    return Comm(device), device


def predicted_samples_per_s(plan: Plan) -> float | None:
    """The planner's predicted throughput, when the plan carries a prediction."""
    p = plan.prediction
    if p is None:
        return None
    if p.samples_per_s:
        return p.samples_per_s
    from planner.throughput import samples_per_s

    return samples_per_s(plan, p.iteration_us)


def resumed_batches(open_chunks, global_batch: int, skip: int, bad: BadRows | None = None):
    """global_batches(skip=skip) that reads the data at most once more to get there.

    The data repeats in epochs: a skip past the end of the first pass is reduced modulo
    the epoch's batch count, so a huge data_position in a manifest cannot loop forever.
    """
    seen = 0
    count = RowCount()
    for b in rebatch(count.through(open_chunks()), global_batch):
        if seen >= skip:
            yield b
        seen += 1
    if seen == 0:
        raise too_few_rows("the data", global_batch, count.rows, bad)
    yield from global_batches(open_chunks, global_batch, skip=skip % seen if skip >= seen else 0)


def _fault_hook(rank: int, step: int) -> None:
    """Test hook: PICASSO_FAULT=RANK:STEP kills that rank at that step (dead-rank tests);
    RANK:STEP:hang makes it hang there instead (hung-rank tests)."""
    spec = os.environ.get("PICASSO_FAULT")
    if spec:
        r, s, *how = spec.split(":")
        if int(r) == rank and int(s) == step:
            if how == ["hang"]:
                import time

                time.sleep(1e6)
            os._exit(3)


def _report_eval(rank: int, res: dict, timer: OpTimer) -> None:
    """One line per evaluation on rank 0's stderr (stdout carries the result JSON); its time since the
    trace's origin is kept for the trace's counter track."""
    res["trace_us"] = (time.perf_counter() - timer.t0) * 1e6
    if rank == 0:
        print(f"eval step {res['step']}: AUC {res['auc']:.6f} logloss {res['logloss']:.6f} over {res['rows']:,} rows",
              file=sys.stderr, flush=True)


def _malformed(dataset, bad: BadRows) -> int:
    """Rows skipped as malformed: at conversion for a dataset, while reading for a log (so far)."""
    return int(dataset.manifest.get("malformed_rows", 0)) if dataset is not None else bad.count


class RankReport(NamedTuple):
    """What each rank hands rank 0 at the end of training (all-gathered as a plain tuple)."""

    events: list  # its timeline events
    times: list[float]  # its timed steps' seconds
    peak: dict[str, int]  # executor.process.memory.peak_bytes
    waits: list[float]  # seconds each timed step waited for its input
    bad: tuple[int, str]  # malformed rows it skipped, the first of them
    exchanged: dict[str, tuple[float, float]]  # per pack: cold, hot rows per micro-batch
    cpu_s: float | None  # its CPU seconds per timed step


def run_worker(args: argparse.Namespace) -> dict | None:
    comm, device = setup(args.timeout)
    rank, world = comm.rank, comm.world
    set_rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", world)))
    plan = Plan.load(args.plan)
    if world != plan.world_size:
        raise ValueError(f"{args.plan}: the plan is for {plan.world_size} ranks, started with {world}")
    hot_ids = plan.load_hot_ids(args.plan)
    # per-op timing splits the dense backward and records events: only when asked for
    op_timing = (args.op_timing or bool(args.trace) or bool(args.timeline)) and not args.no_timing
    timer = OpTimer(rank, device, enabled=op_timing, micro_batches=plan.micro_batches)
    trainer = Trainer(plan, hot_ids, comm, timer)
    start_step = 0
    resumed: dict | None = None
    if args.resume:
        from executor.run.checkpoint import load

        m = load(trainer, args.resume)
        start_step = int(m["data_position"])
        resumed = {"checkpoint": str(args.resume), "data_position": start_step,
                   **({"last_eval": m["last_eval"]} if m.get("last_eval") else {})}
    verify_start = start_state(trainer, args.resume) if (args.verify and args.resume) else None
    model, g, b = plan.model, plan.global_batch, plan.batch_size_per_rank
    bad = BadRows()
    dataset = None if args.data == "synthetic" or not is_dataset(args.data) else Dataset(args.data)
    # plain text: each rank reads its own byte range (executor.data.text_ranges); gzip, UTF-16/32: the whole log
    ranges = (TextRanges(args.data, args.format, world, rank, b, args.strict)
              if dataset is None and splittable(args.data, args.format) else None)
    note = whole_read_note(args.data) if (dataset is None and ranges is None and world > 1
                                          and args.format.lower() in TEXT_FORMATS) else None
    if note and rank == 0:
        print(note, file=sys.stderr, flush=True)
    if args.epochs is not None:
        if args.epochs < 1:
            raise ValueError("--epochs must be at least 1")
        if ranges is not None:
            ranges.per_pass = common_steps_per_epoch(ranges.ranges[rank], args.format, b, comm)
            args.steps = args.epochs * ranges.per_pass
        else:
            args.steps = args.epochs * steps_per_epoch(args.data, args.format, g)
        if args.steps < 1:
            raise DataError(f"{args.data}: fewer rows than one global batch ({g})")
    seed = plan.seed if args.data_seed is None else args.data_seed
    if args.data == "synthetic":
        raw = synthetic_raw(model, args.synthetic_rows or g * 8, seed=plan.seed + 1)

        def open_chunks():
            return iter([raw])
    elif args.preload and dataset is None:
        from executor.data.batches import RawBatch

        raw = RawBatch.concat(list(range_chunks(ranges.ranges[rank], args.format, args.strict, bad) if ranges
                                   else reader_chunks(args.data, args.format, args.strict, bad)))

        def open_chunks():
            return iter([raw])
    else:
        passes = [0]

        def open_chunks():  # malformed rows counted once, in the first pass over the file
            passes[0] += 1
            return reader_chunks(args.data, args.format, args.strict, bad if passes[0] == 1 else None)
    fmap: dict[str, str] = {}

    def global_rows():
        if ranges is not None:  # this rank's batches of its byte range; the global batch for --verify
            mine = ranges.local(start_step, bad, open_chunks if args.preload else None)
            whole = ranges.whole(start_step) if (args.verify and rank == 0) else None
            for x in mine:
                yield (x, next(whole) if whole is not None else None)
            return
        if dataset is None:
            yield from resumed_batches(open_chunks, g, start_step, bad)
            return
        # each rank reads its own rows only; the whole global batch just for --verify's reference
        mine = dataset_batches(dataset, g, rank * b, (rank + 1) * b, seed, start_step)
        whole = dataset_batches(dataset, g, 0, g, seed, start_step) if (args.verify and rank == 0) else None
        for x in mine:
            yield (x, next(whole) if whole is not None else None)

    def prepared():
        for gb in global_rows():
            if dataset is not None or ranges is not None:
                mine, gb = gb
                if not fmap:
                    fmap.update(feature_map(model, mine.sparse))
                local = to_batch(mine, model, fmap)
                keep = to_batch(gb, model, fmap) if gb is not None else None
                if device.type == "cuda":
                    local = local.pin_memory()
                yield local, keep
                continue
            if not fmap:
                fmap.update(feature_map(model, gb.sparse))
            local = to_batch(gb.slice(rank * b, (rank + 1) * b), model, fmap)
            keep = to_batch(gb, model, fmap) if (args.verify and rank == 0) else None
            if device.type == "cuda":  # page-locked here, in the loader thread: the copy is then async
                local = local.pin_memory()
            yield local, keep

    load_native = getattr(kernels, "load_native", None)
    if load_native is not None:  # build/load native kernels now, not inside the first timed step
        load_native()
    if args.preload:
        # every batch prepared up front: the timed steps then hold no parsing or slicing,
        # which a background thread would otherwise interleave with them (GIL, cores)
        batches = [x for _, x in zip(range(args.steps), prepared())]
        loader = Prefetcher(iter(batches), depth=max(len(batches), 1))
    else:
        loader = Prefetcher(prepared(), depth=4)
    kept: list = []
    waits: list[float] = []
    feeder = DeviceFeeder(loader, device)
    evaluator = None
    if args.eval_data:
        from executor.run.evaluate import Evaluator

        evaluator = Evaluator(trainer, args.eval_data, args.eval_format or args.format, args.eval_batch or g)
    clock = StepClock(device)
    graph_mode = GraphMode(args.cuda_graph)
    stepper = graph_stepper(trainer, graph_mode, op_timing, say=None if rank == 0 else (lambda line: None))
    warmup = untimed_steps(args.steps, args.warmup, stepper)
    trimmer = HeapTrimmer()
    losses = LossLog(start_step, max(1, args.check_every))
    comm.barrier()
    timer.reset_origin()
    try:
        # the input pipeline sends the next step's IDs during this one: it needs the next rows
        pipeline = plan.pipelines_inputs
        nxt = next(feeder) if pipeline and args.steps else None
        for s in range(args.steps):
            _fault_hook(rank, s)
            t_in = time.perf_counter()
            if pipeline:
                (local, keep), nxt = nxt, (next(feeder) if s + 1 < args.steps else None)
            else:
                local, keep = next(feeder)
            if s >= warmup:  # the time the step waits for its input (the loader is behind)
                waits.append(time.perf_counter() - t_in)
            if keep is not None:
                kept.append(keep)
            clock.start()
            losses.add(stepper.step(local, nxt[0] if nxt is not None else None))
            trimmer.after_step()  # freed buffers back to the system once RSS grows: not with the run's length
            clock.stop(timed=s >= warmup)
            if s >= warmup:
                timer.flush(start_step + s)
            else:
                timer.discard()
            if evaluator is not None and args.eval_every and (s + 1) % args.eval_every == 0 and s + 1 < args.steps:
                _report_eval(rank, evaluator.run(start_step + s + 1), timer)
        times = clock.seconds()
        timer.finish()
        loss_values = losses.values()
    finally:
        loader.close()
    # samples/s over the timed steps, from the slowest rank's clock
    local_t = torch.tensor([sum(times), float(sum(loss_values[warmup:]) if loss_values else 0.0)], dtype=torch.float64)
    tot = local_t.clone()
    if world > 1:
        tmax = torch.tensor([local_t[0].item()], dtype=torch.float64, device=device)
        dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
        lsum = torch.tensor([local_t[1].item()], dtype=torch.float64, device=device)
        dist.all_reduce(lsum)
        tot = torch.tensor([tmax.item(), lsum.item()], dtype=torch.float64)
    events = [e for e in timer.timeline.events]
    peak = peak_bytes(device)  # training's peak, before --verify's reference adds its own
    mine = RankReport(events, times, peak, waits, (bad.count, bad.first), trainer.exchanged.per_mb(),
                      clock.cpu_seconds_per_step())
    gathered: list = [None] * world
    if world > 1:
        dist.all_gather_object(gathered, tuple(mine))
        gathered = [RankReport(*x) for x in gathered]
    else:
        gathered = [mine]
    if ranges is not None:  # each rank counted the malformed rows of its own byte range
        bad = BadRows(sum(x.bad[0] for x in gathered), next((x.bad[1] for x in gathered if x.bad[1]), ""))
    verify = compare(trainer, kept, start=verify_start) if args.verify else None
    if evaluator is not None:
        _report_eval(rank, evaluator.run(start_step + args.steps), timer)
    # the checkpoint records the last evaluation (this run's, else the one it resumed with)
    last_eval = evaluator.history[-1] if evaluator is not None else (resumed or {}).get("last_eval")
    if args.checkpoint:
        from executor.run.checkpoint import eval_record, save

        save(trainer, args.checkpoint, data_position=start_step + args.steps, keep=args.keep,
             evaluation=eval_record(last_eval, args.eval_data) if evaluator is not None else last_eval)
    if rank != 0:
        return None
    timed = len(times)
    result: dict = {
        "plan": str(args.plan),
        "model": model.name,
        "world_size": world,
        "backend": dist.get_backend() if world > 1 else "none",
        "device": str(device),
        "global_batch": g,
        "micro_batches": plan.micro_batches,
        "dense_dtype": trainer.precision.used,
        **({"dense_dtype_note": trainer.precision.note} if trainer.precision.note else {}),
        "steps": args.steps,
        "timed_steps": timed,
        "start_step": start_step,
        "samples_per_s": (g * timed / float(tot[0])) if timed and float(tot[0]) > 0 else 0.0,
        "iteration_ms": {k: v * 1e3 for k, v in percentiles(times).items()},
        "step_ms": [t * 1e3 for t in times],
        "mean_loss": float(tot[1]) / timed if timed else None,
        "last_loss_rank0_share": loss_values[-1] if loss_values else None,
        "op_timing": op_timing,
        "data": {"path": str(args.data), "kind": "dataset" if dataset is not None else args.format,
                 "steps_per_epoch": (dataset.rows // g) if dataset is not None else (ranges.per_pass if ranges else None),
                 "epochs": args.epochs, "malformed_rows_skipped": _malformed(dataset, bad),
                 "reading": ("row ranges" if dataset is not None else "byte ranges" if ranges is not None
                             else "whole stream per rank"),
                 **({"note": note} if note else {}),
                 **({"first_malformed": bad.first} if bad.first else {})},
    }
    if evaluator is not None:
        result["eval"] = [{k: v for k, v in e.items() if k != "trace_us"} for e in evaluator.history]
    if resumed is not None:
        result["resumed"] = resumed
    pred = predicted_samples_per_s(plan)
    if pred:
        result["predicted_samples_per_s"] = pred
        result["measured_over_predicted_samples"] = result["samples_per_s"] / pred
    from simulator.timeline import Timeline

    tl = Timeline(meta={"source": "measured", "plan": str(args.plan), "world_size": world,
                        "hardware": plan.hardware, "device": str(device)})
    for x in gathered:
        tl.events.extend(x.events)
    for e in evaluator.history if evaluator is not None else []:  # AUC and logloss per evaluation
        tl.count(0, "eval", e["trace_us"], {"auc": e["auc"], "logloss": e["logloss"]}, step=e["step"], rows=e["rows"])
    peaks = [x.peak for x in gathered]
    result["input_wait"] = {  # time each rank's timed steps waited for their input, against their step time
        "mean_ms_per_rank": [1e3 * sum(x.waits) / max(1, len(x.waits)) for x in gathered],
        "fraction_of_step_per_rank": [sum(x.waits) / sum(x.times) if sum(x.times) > 0 else 0.0 for x in gathered],
    }
    if all(x.cpu_s is not None for x in gathered):  # CPU time per step: what the step costs where compute is shared
        result["cpu_ms_per_step_per_rank"] = [1e3 * x.cpu_s for x in gathered]
    if any(x.exchanged for x in gathered):  # ranks that exchanged: their cold rows against the plan's
        result["exchange"], note = exchange_report([x.exchanged for x in gathered],
                                                   plan.prediction.cold_per_mb if plan.prediction else {},
                                                   assumed(plan.provenance.access_source),
                                                   [p.name for p in plan.packs])
        if note:
            result["exchange_note"] = note
    cg = graph_note(stepper, graph_mode, refusal(plan, device, op_timing))
    if cg:
        result["cuda_graph_note"] = cg
    result["peak_memory"] = {  # picasso run adds the planner's prediction beside it
        "measure": "cuda max_memory_allocated" if device.type == "cuda" else "process RSS high-water mark",
        "measured_bytes_per_rank": [pk["device"] for pk in peaks],
        "host_rss_bytes_per_rank": [pk["host_rss"] for pk in peaks],
    }
    if op_timing:
        from simulator.measured import drop_warmup, mean_op_durations

        result["op_durations_us"] = mean_op_durations(drop_warmup(tl, warmup))  # per step, as validate measures
    if args.trace:
        tl.save_chrome_trace(args.trace)
        result["trace"] = str(args.trace)
    if args.timeline:
        tl.save(args.timeline)
        result["timeline"] = str(args.timeline)
    if verify is not None:
        tol = args.verify_tolerance if args.verify_tolerance is not None else default_tolerance(plan.model, trainer.precision.used)
        verify["tolerance"] = tol
        verify["passed"] = bool(verify["max_rel_diff"] <= tol)  # NaN fails
        verify["from_step"] = start_step
        result["verify"] = verify
        result["max_rel_diff"] = verify["max_rel_diff"]
    if args.checkpoint:
        result["checkpoint"] = str(args.checkpoint)
    if args.result:  # the schema checked as it is written (executor.run.result)
        atomic_write_bytes(Path(args.result), RunResult.from_dict(result).to_json().encode())
    return result


def _leave_group(failed: bool, timeout_s: float) -> None:
    """Leave the process group without waiting on a peer that stopped answering.

    Destroying a gloo group waits for its pending work, up to the collective timeout per queued
    op: with a hung peer that is minutes. A failed rank has said why already and exits at once;
    a finished one destroys the group, but exits anyway once `timeout_s` has passed.
    """
    if not dist.is_initialized():
        return
    if not failed:
        import threading

        done = threading.Event()

        def destroy() -> None:
            try:
                dist.destroy_process_group()
            except Exception:  # noqa: BLE001 - leaving anyway
                pass
            done.set()

        threading.Thread(target=destroy, daemon=True, name="leave-group").start()
        if done.wait(timeout_s):
            return
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1 if failed else 0)  # the interpreter's own teardown would wait on the group again


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    rank = os.environ.get("RANK", "0")
    die_with_parent()  # a rank never outlives its agent
    failed = True
    try:
        result = run_worker(args)
        if result is not None and not args.result:
            print(json.dumps(result))
        failed = False
        return 0
    except Exception as exc:  # noqa: BLE001 - one line per rank, no traceback
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, (RuntimeError, dist.DistBackendError)) and not isinstance(exc, ValueError):
            lowered = msg.lower()
            if any(w in lowered for w in ("connection", "timed out", "timeout", "peer", "closed", "broken pipe")):
                msg = f"a collective failed, another rank probably died or hung ({msg})"
        if os.environ.get("PICASSO_DEBUG"):
            import traceback

            traceback.print_exc()
        say(f"executor rank {rank}: error: {msg}")
        return 1
    finally:
        _leave_group(failed, args.timeout)
