"""The steady-state training step as one CUDA graph (`picasso run --cuda-graph`), on one rank.

At batch 4096 a step's kernels are short and the step is bound by launches and Python; a
captured graph replays every kernel of the step with one launch. The step is captured once
its shapes are steady: the first WARMUP steps run eagerly on a side stream (so lazily made
buffers and optimizer state exist before the capture, as torch's capture rules ask), the next
is captured and replayed, every later one is replayed. The step reads its rows from static
input buffers that each batch is copied into.

A plan is refused, with one line saying why, when its step is not the same kernels on the
same buffers every time: several ranks (each step reads the exchange sizes back on the host),
host-placed packs a GPU cannot map (their rows are staged on the host), the input pipeline, 16-bit tables (stochastic rounding draws depend on the
step number), Adam (its bias correction is a host number per step), per-op timing. A batch
whose shapes differ from the captured one (multi-hot bags of another length) runs eagerly,
said once. A capture that fails (an op that reads the device back) leaves the run eager with
one line. Nothing here runs unless asked for, and nothing here runs on the CPU.
"""

from __future__ import annotations

import sys
from typing import Protocol

import numpy as np
import torch

from executor.data.batches import Batch
from executor.run.config import GraphMode
from executor.sparse import host_memory, lowp
from executor.step.trainer import Trainer
from planner.host_access import HostAccess
from planner.plan import Plan

WARMUP = 3  # eager steps before the capture


class Stepper(Protocol):
    def step(self, local: Batch, upcoming: Batch | None = None) -> torch.Tensor: ...


def refusal(plan: Plan, device: torch.device, op_timing: bool = False) -> str | None:
    """Why this plan's step cannot be captured on `device`, or None when it can."""
    if device.type != "cuda":
        return f"the step runs on {device.type}, not a CUDA GPU"
    if plan.world_size > 1:
        return f"{plan.world_size} ranks: each step reads its exchange sizes back on the host"
    host = [p.name for p in plan.packs if p.placement == "host"]
    if host and host_memory.access_on(device) != HostAccess.MAPPED:
        return f"pack {host[0]} is placed in host memory that this GPU cannot map: its rows are staged on the host"
    if plan.pipelines_inputs:
        return "the input pipeline routes the next step's IDs during each step"
    low = [t.name for t in plan.model.tables if lowp.is_low(lowp.storage_dtype(t.dtype))]
    if low:
        return f"table {low[0]} is {plan.model.table(low[0]).dtype}: stochastic rounding draws depend on the step"
    if plan.optimizer.dense == "adam":
        return "the dense optimizer adam computes its bias correction on the host each step"
    if op_timing:
        return "per-op timing records host events around every op"
    return None


def _same_shapes(a: Batch, b: Batch) -> bool:
    """Whether `b` fits `a`'s buffers. Padded buffers (`a.pad_bags`): same rows, and each table's
    IDs no more than its buffer holds (the bags' lengths may change: the rest is padding). Else
    the same IDs per table and the same bag offsets (micro-batch cuts are baked into the graph)."""
    if a.labels.shape != b.labels.shape or a.dense.shape != b.dense.shape or a.sparse.keys() != b.sparse.keys():
        return False
    if a.pad_bags:
        return all(len(b.sparse[t][0]) <= len(a.sparse[t][0]) for t in a.sparse)
    ha, hb = a._host_offsets(), b._host_offsets()
    return all(a.sparse[t][0].shape == b.sparse[t][0].shape and np.array_equal(ha[t], hb[t]) for t in a.sparse)


def _capacity(n: int, rows: int) -> int:
    """IDs a table's padded buffer holds: one per row where the first batch had at most that
    (one-hot tables, with missing values or not, never need more), else a quarter over its count."""
    return rows if n <= rows else -(-n * 5 // 4 // 64) * 64


def _static_copy(b: Batch, pad: bool) -> Batch:
    """Buffers on `b`'s device holding its values; with `pad`, each table's IDs in a buffer of
    `_capacity` (the rows past its last bag are padding: Batch.pad_bags)."""
    host = b._host_offsets()
    if not pad:
        return Batch(b.labels.clone(), b.dense.clone(), {t: (r.clone(), o.clone()) for t, (r, o) in b.sparse.items()},
                     {t: h.copy() for t, h in host.items()})
    sparse = {t: (torch.zeros(_capacity(len(r), len(b)), dtype=r.dtype, device=r.device), o.clone())
              for t, (r, o) in b.sparse.items()}
    static = Batch(b.labels.clone(), b.dense.clone(), sparse, {t: h.copy() for t, h in host.items()}, pad_bags=True)
    _copy_into(static, b)
    return static


def _copy_into(static: Batch, b: Batch) -> None:
    """`b`'s values into the static buffers: every copy in one multi-tensor copy and every
    padding tail in one multi-tensor fill (a few kernels, not two per table)."""
    dst, src, tails = [static.labels, static.dense], [b.labels, b.dense], []
    for t, (rows, off) in b.sparse.items():
        buf = static.sparse[t][0]
        n = len(rows)  # a host number: the batch's offsets live on the host too
        dst += [buf[:n], static.sparse[t][1]]
        src += [rows, off]
        if n < len(buf):
            tails.append(buf[n:])  # padding reads the table's row 0 into a bag the model never reads
    torch._foreach_copy_(dst, src, non_blocking=True)
    if tails:
        torch._foreach_zero_(tails)


class GraphStep:
    """A Trainer's step, captured once and replayed (see the module doc). `say` gets the one
    line of a refusal or fallback (rank 0's stderr)."""

    def __init__(self, trainer: Trainer, say=None) -> None:
        self.trainer = trainer
        self.say = say or (lambda line: print(line, file=sys.stderr, flush=True))
        self.static: Batch | None = None
        self.graph: torch.cuda.CUDAGraph | None = None
        self.loss: torch.Tensor | None = None
        self.eager_why: str | None = None  # set when the run stays eager
        self.seen = 0
        self.replayed = 0  # steps the graph served
        self.uncaptured = 0  # steps after the capture that ran eagerly (other shapes, or no graph)
        self._warned_shapes = False
        self.side = torch.cuda.Stream(device=trainer.dev)
        # padded buffers where the step allows them: one micro-batch (no cuts baked in) and no
        # sequence tables (their IDs are the model's inputs one by one)
        plan = trainer.plan
        self.pads = plan.micro_batches == 1 and all(t.pooling != "none" for t in plan.model.tables)

    def step(self, local: Batch, upcoming: Batch | None = None) -> torch.Tensor:
        tr = self.trainer
        local = local.to(tr.dev)
        if self.eager_why is not None:
            self.uncaptured += 1
            return tr.step(local)
        if self.static is None:
            self.static = _static_copy(local, self.pads)
        elif not _same_shapes(self.static, local):
            if not self._warned_shapes:
                self.say("cuda graph: a batch of other shapes than the captured one runs uncaptured "
                         "(more IDs than the buffers hold, or bags of other lengths)")
                self._warned_shapes = True
            self.uncaptured += 1
            return tr.step(local)
        else:
            _copy_into(self.static, local)
        self.seen += 1
        if self.seen <= WARMUP:
            self.side.wait_stream(torch.cuda.current_stream(tr.dev))
            with torch.cuda.stream(self.side):
                loss = tr.step(self.static)
            torch.cuda.current_stream(tr.dev).wait_stream(self.side)
            return loss
        if self.graph is None:
            return self._capture()
        self.graph.replay()
        self.replayed += 1
        self._count_step()
        return self.loss.clone()

    def _count_step(self) -> None:
        """The host counters a captured step would have advanced."""
        self.trainer.steps_done += 1
        self.trainer.opt.steps += 1

    def _capture(self) -> torch.Tensor:
        tr = self.trainer
        graph = torch.cuda.CUDAGraph()
        steps, opt_steps = tr.steps_done, tr.opt.steps
        torch.cuda.synchronize(tr.dev)
        try:
            with torch.cuda.graph(graph):
                loss = tr.step(self.static)
        except Exception as exc:  # noqa: BLE001 - any op that cannot be captured: stay eager
            tr.steps_done, tr.opt.steps = steps, opt_steps
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.eager_why = f"capture failed ({type(exc).__name__}: {first})"
            self.say(f"cuda graph: {self.eager_why}; the run continues without it")
            return tr.step(self.static)
        tr.steps_done, tr.opt.steps = steps, opt_steps  # the capture ran no kernel: the replay is the step
        self.graph, self.loss = graph, loss
        graph.replay()
        self.replayed += 1
        self._count_step()
        return loss.clone()


def graph_stepper(trainer: Trainer, mode: GraphMode, op_timing: bool, say=None) -> Stepper:
    """The trainer itself, or its captured step where `mode` asks and the plan allows; a
    refusal is said in one line when the graph was asked for (`on`), and the run goes on
    uncaptured."""
    if mode == GraphMode.OFF:
        return trainer
    why = refusal(trainer.plan, trainer.dev, op_timing)
    if why is not None:
        if mode == GraphMode.ON:
            (say or (lambda line: print(line, file=sys.stderr, flush=True)))(
                f"cuda graph: not used: {why}; the run continues without it")
        return trainer
    return GraphStep(trainer, say)


def untimed_steps(steps: int, asked: int | None, stepper: Stepper) -> int:
    """The run's untimed first steps: `--warmup`, else a quarter of the steps (1 to 3), and with
    a graph at least its eager steps and its capture (a step of tens of ms, not a steady one)."""
    if asked is not None:
        return asked
    if steps <= 1:
        return 0
    quarter = min(3, max(1, steps // 4))
    return min(steps - 1, max(quarter, WARMUP + 1)) if isinstance(stepper, GraphStep) else quarter


def graph_note(stepper: Stepper, mode: GraphMode, why_not: str | None) -> str | None:
    """The run result's line on --cuda-graph: the steps the graph served, or why none (a
    refusal where the graph was asked for, a failed capture, batches larger than the buffers)."""
    if mode == GraphMode.OFF:
        return None
    if why_not is not None:
        return f"cuda graph: not used: {why_not}" if mode == GraphMode.ON else None
    if not isinstance(stepper, GraphStep):
        return None
    total = stepper.seen + stepper.uncaptured
    line = f"cuda graph: {stepper.replayed} of {total} steps replayed the captured graph"
    if stepper.eager_why is not None:
        line += f"; {stepper.eager_why}"
    elif stepper._warned_shapes:
        line += (f"; {stepper.uncaptured} ran uncaptured: their batches held more IDs than the captured "
                 "buffers" + ("" if stepper.pads else ", or bags of other lengths (several micro-batches or "
                                                  "sequence tables keep the captured lengths)"))
    return line
