"""The dense gradients' all-reduce in buckets, each launched as soon as its gradients are final.

As DDP does: each bucket (planner.op_names.GRAD_BUCKETS) owns one flat buffer and its parameters' `.grad` are views of
it, so the all-reduce needs no copy in or out. A post-accumulate-grad hook on every parameter
counts the gradients accumulated in the last micro-batch; when a bucket's count is full the
bucket is launched, asynchronously, while the backward of the stages below it and of the
packs goes on. Buckets are launched in their fixed order on every rank (gloo matches
collectives by launch order): a bucket ready before its predecessor waits for it.

They run in a process group of their own (lane GRAD_LANE in lowering), so the last micro-batch's
gradient exchange, launched after them, does not queue behind them in the default group (gloo,
like one NCCL communicator, runs one group's collectives in order) and the embedding updates
are not delayed (bench/results/grad_overlap.json).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from executor.comm import Comm
from executor.dense import DenseArch
from executor.timing import OpTimer
from planner.op_names import GRAD_BUCKETS
from planner.program_ops import GRAD_LANE


@dataclass
class Bucket:
    name: str  # the op name's last part, e.g. "allreduce_top_mlp"
    params: list[torch.nn.Parameter]
    flat: torch.Tensor  # the parameters' gradients, end to end
    pending: int = 0  # gradients not yet accumulated in this step's last micro-batch
    work: Any = None  # the launched all-reduce
    views: list[torch.Tensor] = field(default_factory=list)


class GradBuckets:
    def __init__(self, dense: DenseArch, comm: Comm, timer: OpTimer) -> None:
        self.comm, self.timer = comm, timer
        stages = dense.stage_params()
        self.buckets: list[Bucket] = []
        for name, members in GRAD_BUCKETS:
            params = [p for s in members for p in stages[s]]
            if not params:
                continue
            flat = torch.zeros(sum(p.numel() for p in params), device=next(iter(params)).device)
            b = Bucket(name, params, flat)
            off = 0
            for p in params:
                b.views.append(flat[off : off + p.numel()].view_as(p))
                off += p.numel()
                p.register_post_accumulate_grad_hook(lambda _p, b=b: self._accumulated(b))
            self.buckets.append(b)
        self.armed = False
        self.launched = 0
        self.group = comm.new_group() if self.buckets and comm.active else None

    def begin_step(self) -> None:
        """Point every parameter's gradient at its bucket (anything that replaced a `.grad`
        is undone) and zero the buffers; no bucket is armed yet."""
        for b in self.buckets:
            for p, v in zip(b.params, b.views):
                if p.grad is not v:
                    p.grad = v
            b.flat.zero_()
            b.work = None
        self.armed = False
        self.launched = 0

    def arm(self) -> None:
        """The next backward is the step's last micro-batch's: launch buckets as they fill."""
        self.armed = True
        for b in self.buckets:
            b.pending = len(b.params)

    def _accumulated(self, b: Bucket) -> None:
        if not self.armed:
            return
        b.pending -= 1
        # launch in order every bucket that is full and whose predecessors are launched
        while self.launched < len(self.buckets) and self.buckets[self.launched].pending <= 0:
            self._launch(self.buckets[self.launched])

    def flush(self) -> None:
        """After the last micro-batch's dense backward: launch, in order, any bucket not yet
        launched (a parameter the loss did not reach gets no gradient, hence no hook)."""
        while self.launched < len(self.buckets):
            self._launch(self.buckets[self.launched])
        self.armed = False

    def _launch(self, b: Bucket) -> None:
        tok = self.timer.start("bwd", "dense", b.name, lane=GRAD_LANE)
        b.work = self.comm.all_reduce(b.flat, async_op=True, group=self.group)
        self.timer.end_when_done(tok, b.work)
        self.launched += 1

    def wait(self) -> None:
        """Wait for every bucket: the parameters' gradients are then the reduced ones."""
        for b in self.buckets:
            b.work.wait()
