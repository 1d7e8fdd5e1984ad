"""`picasso run`: train a plan for real with torch.distributed workers (executor.process.agent starts them)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from executor.run.config import RunConfig
from foundation.settings import add_arguments, from_namespace

if TYPE_CHECKING:
    from executor.run.result import RunResult


def register(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("run", parents=[common], help="run a plan for real (torch.distributed workers, gloo or NCCL)")
    add_arguments(p, RunConfig)  # every flag is a RunConfig field
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    config = from_namespace(RunConfig, args)
    res = execute(config)
    if res is None:  # another node's workers: rank 0's node reports
        print(json.dumps({"node_rank": args.node_rank}) if args.json else f"node {args.node_rank}: workers finished")
        return 0
    failed = verify_failure(res)
    for note in (res.data.note, res.exchange_note, res.cuda_graph_note):  # a whole-read gzip, a missed hot set, graphs
        if note:
            import sys

            print(note, file=sys.stderr)
    if args.json:
        print(res.to_json(), end="")
        return _fail(failed)
    it = res.iteration_ms
    print(f"plan {res.plan} ({res.model}), {res.world_size} ranks on {res.backend}/{res.device}, "
          f"global batch {res.global_batch}, {res.micro_batches} micro-batch(es)")
    if res.resumed is not None:
        print(_resume_line(res.resumed))
    print(f"throughput   {res.samples_per_s:,.0f} samples/s over {res.timed_steps} timed steps")
    print(f"iteration    p50 {it['p50']:.2f} ms  p90 {it['p90']:.2f} ms  p99 {it['p99']:.2f} ms")
    if res.cpu_ms_per_step_per_rank:
        cpu = sum(res.cpu_ms_per_step_per_rank) / len(res.cpu_ms_per_step_per_rank)
        if it.get("mean"):  # under 1 core per rank with the ranks busy: they share the cores
            print(f"cpu          {cpu:.1f} ms per step and rank ({cpu / it['mean']:.2f} of a core "
                  f"over the {it['mean']:.1f} ms mean step)")
    if res.input_wait:
        w = res.input_wait
        worst = max(range(len(w["fraction_of_step_per_rank"])), key=lambda r: w["fraction_of_step_per_rank"][r])
        print(f"input wait   {w['fraction_of_step_per_rank'][worst]:.1%} of the step on rank {worst} "
              f"({w['mean_ms_per_rank'][worst]:.2f} ms per step waiting for the loader)")
    if res.mean_loss is not None:
        print(f"loss         {res.mean_loss:.4f} (mean over timed steps)")
    if res.predicted_samples_per_s is not None:
        print(f"prediction   {res.predicted_samples_per_s:,.0f} samples/s "
              f"(measured/predicted {res.measured_over_predicted_samples:.2f})")
    for name, x in (res.exchange or {}).items():
        want = x.get("predicted_cold_per_mb")
        print(f"exchange     {name}: {x['cold_per_mb']:,.0f} cold rows per micro-batch and rank"
              + (f" (predicted {want:,.0f})" if want is not None else "") + f", {x['hot_per_mb']:,.0f} hot")
    pm = res.peak_memory
    if pm.predicted_bytes_per_rank is not None:
        print("peak memory  " + ", ".join(
            f"rank {r}: {m / 2**30:.2f} GiB (predicted {p / 2**30:.2f})"
            for r, (m, p) in enumerate(zip(pm.measured_bytes_per_rank, pm.predicted_bytes_per_rank))))
    d = res.data
    if d.malformed_rows_skipped:
        print(f"data         {d.malformed_rows_skipped:,} malformed rows skipped"
              + (f" (first: {d.first_malformed})" if d.first_malformed else ""))
    for e in res.eval:
        print(f"eval         step {e.step}: AUC {e.auc:.4f}  logloss {e.logloss:.4f} ({e.rows:,} held-out rows)")
    if res.verify is not None:
        v = res.verify
        print(f"verify       max relative difference to the reference {v.max_rel_diff:.2e} "
              f"(embeddings {v.embedding_rel_diff:.2e}, dense {v.dense_rel_diff:.2e})")
        if pm.verify_reference_bytes:
            print(f"             the reference (every full table, on rank 0) was predicted to cost "
                  f"{pm.verify_reference_bytes / 2**30:.2f} GiB")
    for key in ("trace", "timeline", "checkpoint"):
        if getattr(res, key):
            print(f"{key:12} {getattr(res, key)}")
    return _fail(failed)


def execute(config: RunConfig) -> RunResult | None:
    """Check the inputs and the memory, start the ranks, and return rank 0's result (None on
    another node): the work of `picasso run` and `picasso.run`. The config checked its own values."""
    from executor.data.inputs import check_inputs
    from executor.process.launch import launch
    from executor.run.checkpoint import check_resume
    from executor.run.outputs import run_outputs
    from planner.plan import Plan

    c = config
    outs = run_outputs(c.plan, c.data, c.eval_data, c.resume, c.trace, c.timeline, c.checkpoint)
    outs.check()
    check_inputs(Plan.load(c.plan).model, c.data, c.format, c.eval_data, c.eval_format)
    check_resume(c.resume, Plan.load(c.plan))
    pred = _memory_check(c)
    with _checkpoint_writer(c), outs.claimed("--checkpoint" if c.node_rank == 0 else None):
        res = launch(c)
    if res is not None and pred is not None:
        from executor.run.memory import attach_measured

        attach_measured(res, pred)
    return res


def _checkpoint_writer(c: RunConfig):
    """The --checkpoint folder's writer lock, held by node 0 for the whole run: a second run
    writing the same folder is refused before any rank starts."""
    import contextlib

    from foundation.locks import one_writer

    if c.checkpoint is None or c.node_rank != 0:
        return contextlib.nullcontext()
    return one_writer(c.checkpoint, "checkpoint folder")


def _resume_line(r: dict) -> str:
    """Where a resumed run started, and the checkpoint's last evaluation."""
    line = f"resumed      {r['checkpoint']} at step {r['data_position']}"
    e = r.get("last_eval")
    if e:
        auc = f"{e['auc']:.4f}" if e.get("auc") is not None else "undefined"
        line += f" (last evaluation: step {e['step']}, AUC {auc}, logloss {e['logloss']:.4f})"
    return line


def verify_failure(res: RunResult) -> str | None:
    """The one line to print when --verify found the run off the reference, else None."""
    v = res.verify
    if v is None or v.passed:
        return None
    return (f"picasso run: error: --verify: the trained weights differ from the reference by {v.max_rel_diff:.3g} "
            f"(relative), above the tolerance {v.tolerance:.3g}")


def _fail(line: str | None) -> int:
    if line is None:
        return 0
    import sys

    print(line, file=sys.stderr)
    return 1


def _memory_check(c: RunConfig) -> dict | None:
    """The planner's predicted peak per rank; refuses (one line) a plan this machine cannot hold."""
    from pathlib import Path

    from executor.run.memory import check_fits, predicted_peaks
    from executor.sparse.optimizers import check_trainable
    from planner.plan import Plan

    if c.data != "synthetic" and not Path(c.data).exists():
        return None  # launch names the missing file
    plan = Plan.load(c.plan)
    check_trainable(plan)
    nproc = c.nproc or plan.world_size // c.nnodes
    if nproc * c.nnodes != plan.world_size:
        return None  # launch names the mismatch
    import torch

    kind = "cuda" if torch.cuda.is_available() else "cpu"
    pred = predicted_peaks(plan, kind, c.data, c.format, c.preload, c.steps, c.verify, bool(c.resume))
    if not c.no_memory_check:
        check_fits(pred, kind, range(c.node_rank * nproc, (c.node_rank + 1) * nproc), c.verify)
    return pred
