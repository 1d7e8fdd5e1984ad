"""The worker a rank runs (`python -m executor CONFIG.json`, started by executor.process.agent, torchrun
or by hand; the config is a RunConfig's JSON, executor.run.config).

It reads the plan, joins the process group (NCCL with CUDA, gloo otherwise, with a
timeout on collectives), reads its rows of each global batch from its data source
(executor.run.sources) in a background thread, trains, times every op, and rank 0 writes the
result JSON, the Chrome trace / Timeline and, with --verify, the comparison with the reference.
One rank's run is a `RankRun`, in phases: set-up, data source, warm-up, training, reductions, finish.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.distributed as dist

from executor.comm import Comm
from executor.data.batches import BadRows, DataError, DeviceFeeder, Prefetcher, feature_map, to_batch
from executor.process.allocator import HeapTrimmer
from executor.process.lines import say
from executor.process.memory import peak_bytes
from executor.process.process_tree import die_with_parent
from executor.process.rendezvous import join_store
from executor.process.threads import set_rank_threads
from executor.run.config import RunConfig
from executor.run.cuda_graph import graph_stepper, untimed_steps
from executor.run.result import RunResult
from executor.run.result_build import rank0_result
from executor.run.sources import open_source
from executor.run.verify import compare, start_state
from executor.sparse import kernels
from executor.step.timing import LossLog, OpTimer, StepClock
from executor.step.trainer import Trainer
from foundation.files import atomic_write_bytes
from foundation.progress import rank_step
from planner.plan import Plan


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


def _fault_hook(rank: int, step: int) -> None:
    """Test hook: PICASSO_FAULT=RANK:STEP kills that rank at that step (dead-rank tests);
    RANK:STEP:hang makes it hang there instead (hung-rank tests)."""
    spec = os.environ.get("PICASSO_FAULT")
    if spec:
        r, s, *how = spec.split(":")
        if int(r) == rank and int(s) == step:
            if how == ["hang"]:
                time.sleep(1e6)
            os._exit(3)


class RankReport(NamedTuple):
    """What each rank hands rank 0 at the end of training (all-gathered as a plain tuple)."""

    events: list  # its timeline events
    times: list[float]  # its timed steps' seconds
    peak: dict[str, int]  # executor.process.memory.peak_bytes
    waits: list[float]  # seconds each timed step waited for its input
    bad: tuple[int, str]  # malformed rows it skipped, the first of them
    exchanged: dict[str, tuple[float, float]]  # per pack: cold, hot rows per micro-batch
    cpu_s: float | None  # its CPU seconds per timed step


class RankRun:
    """One rank's run of a plan, in the order `run` calls its phases; each phase leaves on the
    object what the next one reads."""

    def __init__(self, cfg: RunConfig) -> None:
        self.cfg = cfg

    def run(self) -> RunResult | None:
        """Rank 0's result (None on the other ranks)."""
        self.set_up()
        self.open_data()
        self.warm_up()
        self.train()
        self.reduce()
        return self.finish()

    # ---- set-up: the group, the plan, the trainer, a checkpoint to resume ------------------------
    def set_up(self) -> None:
        cfg = self.cfg
        self.comm, self.device = setup(cfg.timeout)
        self.rank, self.world = self.comm.rank, self.comm.world
        set_rank_threads(int(os.environ.get("LOCAL_WORLD_SIZE", self.world)))
        self.plan = plan = Plan.load(cfg.plan)
        if self.world != plan.world_size:
            raise ValueError(f"{cfg.plan}: the plan is for {plan.world_size} ranks, started with {self.world}")
        hot_ids = plan.load_hot_ids(cfg.plan)
        # per-op timing splits the dense backward and records events: only when asked for
        self.op_timing = (cfg.op_timing or bool(cfg.trace) or bool(cfg.timeline)) and not cfg.no_timing
        self.timer = OpTimer(self.rank, self.device, enabled=self.op_timing, micro_batches=plan.micro_batches)
        self.trainer = Trainer(plan, hot_ids, self.comm, self.timer)
        self.start_step, self.resumed = 0, None
        if cfg.resume:
            from executor.run.checkpoint import load

            m = load(self.trainer, cfg.resume)
            self.start_step = int(m["data_position"])
            self.resumed = {"checkpoint": str(cfg.resume), "data_position": self.start_step,
                            **({"last_eval": m["last_eval"]} if m.get("last_eval") else {})}
        self.verify_start = start_state(self.trainer, cfg.resume) if (cfg.verify and cfg.resume) else None

    # ---- the data source, and the steps it gives with --epochs ----------------------------------
    def open_data(self) -> None:
        cfg = self.cfg
        self.bad = BadRows()
        self.source = open_source(cfg, self.plan, self.comm, self.bad)
        if self.source.note and self.rank == 0:
            print(self.source.note, file=sys.stderr, flush=True)
        self.steps = cfg.steps
        if cfg.epochs is not None:
            self.steps = cfg.epochs * self.source.epoch_steps()
            if self.steps < 1:
                raise DataError(f"{cfg.data}: fewer rows than one global batch ({self.plan.global_batch})")
            if cfg.warmup is not None and cfg.warmup >= self.steps:
                raise ValueError(f"--warmup {cfg.warmup} leaves no timed step of the {self.steps} steps of "
                                 f"--epochs {cfg.epochs} (at most {self.steps - 1})")

    def _prepared(self):
        """This rank's batches (pinned on CUDA, in the loader thread: the copy is then async), and
        the whole global batch where --verify keeps it."""
        model, fmap = self.plan.model, {}
        for mine, whole in self.source.batches(self.start_step):
            if not fmap:
                fmap = feature_map(model, mine.sparse)
            local = to_batch(mine, model, fmap)
            keep = to_batch(whole, model, fmap) if whole is not None else None
            yield (local.pin_memory() if self.device.type == "cuda" else local), keep

    # ---- warm-up: the loader, the evaluator, the stepper, and the untimed first steps -----------
    def warm_up(self) -> None:
        cfg = self.cfg
        load_native = getattr(kernels, "load_native", None)
        if load_native is not None:  # build/load native kernels now, not inside the first timed step
            load_native()
        if cfg.preload:
            # every batch prepared up front: the timed steps then hold no parsing or slicing,
            # which a background thread would otherwise interleave with them (GIL, cores)
            batches = [x for _, x in zip(range(self.steps), self._prepared())]
            self.loader = Prefetcher(iter(batches), depth=max(len(batches), 1))
        else:
            self.loader = Prefetcher(self._prepared(), depth=4)
        self.feeder = DeviceFeeder(self.loader, self.device)
        self.evaluator = None
        if cfg.eval_data:
            from executor.run.evaluate import Evaluator

            self.evaluator = Evaluator(self.trainer, cfg.eval_data, cfg.eval_format or cfg.format,
                                       cfg.eval_batch or self.plan.global_batch)
        self.clock = StepClock(self.device)
        quiet = None if self.rank == 0 else (lambda line: None)
        self.stepper = graph_stepper(self.trainer, cfg.cuda_graph, self.op_timing, say=quiet)
        self.warmup = untimed_steps(self.steps, cfg.warmup, self.stepper)
        self.trimmer = HeapTrimmer()
        self.losses = LossLog(self.start_step, cfg.check_every)
        self.kept: list = []  # --verify's global batches
        self.waits: list[float] = []
        self.comm.barrier()
        self.timer.reset_origin()

    # ---- training: the steps, warm-up and timed ---------------------------------------------------
    def train(self) -> None:
        try:
            # the input pipeline sends the next step's IDs during this one: it needs the next rows
            pipeline = self.plan.pipelines_inputs
            nxt = next(self.feeder) if pipeline and self.steps else None
            for s in range(self.steps):
                _fault_hook(self.rank, s)
                t_in = time.perf_counter()
                if pipeline:
                    (local, keep), nxt = nxt, (next(self.feeder) if s + 1 < self.steps else None)
                else:
                    local, keep = next(self.feeder)
                self.step(s, local, keep, nxt[0] if nxt is not None else None, time.perf_counter() - t_in)
            self.times = self.clock.seconds()
            self.timer.finish()
            self.loss_values = self.losses.values()
        finally:
            self.loader.close()

    def step(self, s: int, local, keep, upcoming, waited_s: float) -> None:
        """Step `s` of this run on this rank's batch (`upcoming`: the next one, for the input pipeline)."""
        timed = s >= self.warmup
        if timed:  # the time the step waited for its input (the loader is behind)
            self.waits.append(waited_s)
        if keep is not None:
            self.kept.append(keep)
        self.clock.start()
        self.losses.add(self.stepper.step(local, upcoming))
        self.trimmer.after_step()  # freed buffers back to the system once RSS grows: not with the run's length
        self.clock.stop(timed=timed)
        if self.rank == 0:  # the launcher draws it (foundation.progress); nothing when none asked
            rank_step(s + 1, self.steps, self.plan.global_batch)
        if timed:
            self.timer.flush(self.start_step + s)
        else:
            self.timer.discard()
        every = self.cfg.eval_every
        if self.evaluator is not None and every and (s + 1) % every == 0 and s + 1 < self.steps:
            self._report_eval(self.evaluator.run(self.start_step + s + 1))

    def _report_eval(self, res: dict) -> None:
        """One line per evaluation on rank 0's stderr (stdout carries the result JSON); its time since
        the trace's origin is kept for the trace's counter track."""
        res["trace_us"] = (time.perf_counter() - self.timer.t0) * 1e6
        if self.rank == 0:
            print(f"eval step {res['step']}: AUC {res['auc']:.6f} logloss {res['logloss']:.6f} over "
                  f"{res['rows']:,} rows", file=sys.stderr, flush=True)

    # ---- reductions: the slowest rank's time, the loss sum, every rank's report on rank 0 -------
    def reduce(self) -> None:
        times, values = self.times, self.loss_values
        self.total_s = sum(times)
        self.loss_sum = float(sum(values[self.warmup:]) if values else 0.0)
        if self.world > 1:  # samples/s over the timed steps, from the slowest rank's clock
            tmax = torch.tensor([self.total_s], dtype=torch.float64, device=self.device)
            dist.all_reduce(tmax, op=dist.ReduceOp.MAX)
            lsum = torch.tensor([self.loss_sum], dtype=torch.float64, device=self.device)
            dist.all_reduce(lsum)
            self.total_s, self.loss_sum = tmax.item(), lsum.item()
        peak = peak_bytes(self.device)  # training's peak, before --verify's reference adds its own
        mine = RankReport(list(self.timer.timeline.events), times, peak, self.waits,
                          (self.bad.count, self.bad.first), self.trainer.exchanged.per_mb(),
                          self.clock.cpu_seconds_per_step())
        if self.world > 1:
            gathered: list = [None] * self.world
            dist.all_gather_object(gathered, tuple(mine))
            self.reports = [RankReport(*x) for x in gathered]
        else:
            self.reports = [mine]
        self.malformed = self.source.malformed([x.bad for x in self.reports])

    # ---- finish: verify, the last evaluation, the checkpoint, rank 0's result --------------------
    def finish(self) -> RunResult | None:
        cfg = self.cfg
        verify = compare(self.trainer, self.kept, start=self.verify_start) if cfg.verify else None
        if self.evaluator is not None:
            self._report_eval(self.evaluator.run(self.start_step + self.steps))
        # the checkpoint records the last evaluation (this run's, else the one it resumed with)
        last_eval = self.evaluator.history[-1] if self.evaluator is not None else (self.resumed or {}).get("last_eval")
        if cfg.checkpoint:
            from executor.run.checkpoint import eval_record, save

            save(self.trainer, cfg.checkpoint, data_position=self.start_step + self.steps, keep=cfg.keep,
                 evaluation=eval_record(last_eval, cfg.eval_data) if self.evaluator is not None else last_eval)
        if self.rank != 0:
            return None
        result = rank0_result(self, verify)
        if cfg.result:
            atomic_write_bytes(Path(cfg.result), result.to_json().encode())
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


def run_worker(cfg: RunConfig) -> RunResult | None:
    """One rank's run (rank 0's result, None elsewhere)."""
    return RankRun(cfg).run()


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    rank = os.environ.get("RANK", "0")
    if len(argv) != 1 or argv[0].startswith("-"):
        say(f"usage: python -m executor CONFIG.json (a RunConfig's JSON, executor.run.config); got {argv}")
        return 2
    die_with_parent()  # a rank never outlives its agent
    failed = True
    timeout = RunConfig.__dataclass_fields__["timeout"].default  # until the config is read
    try:
        cfg = RunConfig.load(argv[0])
        timeout = cfg.timeout
        result = run_worker(cfg)
        if result is not None and not cfg.result:
            print(result.to_json(), end="")
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
        _leave_group(failed, timeout)
