"""Collectives behind one small interface, with a no-op single-process fallback.

Exchanges of variable size go through `all_to_all_single` on flat 1-D tensors with
split sizes (gloo does not support the list form with unequal sizes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist


def wire_id_dtype(nbytes: int) -> torch.dtype:
    """The dtype IDs and bag lengths travel in (Plan.wire_id_bytes: 4 -> int32, else int64)."""
    return torch.int32 if nbytes == 4 else torch.int64


class Done:
    """Handle of an operation that already completed (single process, or synchronous)."""

    def wait(self) -> bool:
        return True

    def is_completed(self) -> bool:
        return True


class Comm:
    def __init__(self, device: torch.device | None = None) -> None:
        self.active = dist.is_available() and dist.is_initialized()
        self.rank = dist.get_rank() if self.active else 0
        self.world = dist.get_world_size() if self.active else 1
        self.device = device or torch.device("cpu")
        self.group = None  # the process group a2a and exchange_counts use (None: the default one)
        self._input_group = None
        self._grad_groups: dict[str, object] = {}  # "bucket", "sync": open_grad_groups

    def open_input_group(self) -> None:
        """Create the input pipeline's own process group (every rank calls it, in the same
        place): the next batch's ID exchange then runs beside this step's collectives instead
        of queueing behind them, as TorchRec's input distribution does on its own stream."""
        if self.world > 1 and self._input_group is None:
            self._input_group = dist.new_group(list(range(self.world)))

    @contextmanager
    def inputs(self) -> Iterator[None]:
        """a2a and exchange_counts inside go over the input group (open_input_group)."""
        if self.world > 1 and self._input_group is None:
            raise RuntimeError("the input pipeline's process group was not opened")
        saved, self.group = self.group, self._input_group
        try:
            yield
        finally:
            self.group = saved

    def a2a(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: list[int],
        in_splits: list[int],
        async_op: bool = False,
    ):
        """out gets, from each rank j, the segment rank j sent to this rank."""
        if self.world == 1:
            out.copy_(inp)
            return Done()
        work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=self.group, async_op=async_op)
        return work if async_op else Done()

    def exchange_counts(self, send_counts: torch.Tensor) -> torch.Tensor:
        """send_counts [world, m] (m numbers for each destination) -> the numbers each source sent."""
        if self.world == 1:
            return send_counts.clone()
        out = torch.empty_like(send_counts)
        dist.all_to_all_single(out, send_counts.contiguous(), group=self.group)
        return out

    def open_grad_groups(self) -> None:
        """Create the dense gradients' process groups (every rank calls it, in the same place):
        "bucket" for the buckets launched during the backward, "sync" for the step's last
        all-reduce (with the hot rows'), so that neither queues behind the exchanges, nor the
        last behind the buckets, as DDP's all-reduces run on a stream of their own."""
        if self.world > 1 and not self._grad_groups:
            self._grad_groups = {g: dist.new_group(list(range(self.world))) for g in ("bucket", "sync")}

    def all_reduce(self, t: torch.Tensor, async_op: bool = False, group: str | None = None):
        """Sum `t` over the ranks; `group`: one of the dense gradients' groups (open_grad_groups),
        None: the default group."""
        if self.world == 1:
            return Done()
        if group is not None and group not in self._grad_groups:
            raise RuntimeError(f"the dense gradients' process group {group!r} was not opened")
        work = dist.all_reduce(t, async_op=async_op, group=self._grad_groups.get(group) if group else None)
        return work if async_op else Done()

    def start_all_gather_rows(self, rows: torch.Tensor, values: torch.Tensor, async_op: bool = True,
                              sizes: list[int] | None = None):
        """Launch the gather of every rank's (rows, values), concatenated in rank order (a padded
        all_gather); returns a function that waits and gives the result.
        `sizes` (every rank's row count, when the caller knows them) saves a round trip
        and a read back of the counts."""
        if self.world == 1:
            return lambda: (rows, values)
        if sizes is None:
            n = torch.tensor([len(rows)], dtype=torch.int64, device=rows.device)
            got = [torch.zeros_like(n) for _ in range(self.world)]
            dist.all_gather(got, n)
            sizes = [int(s.item()) for s in got]
        elif sizes[self.rank] != len(rows):
            raise RuntimeError(f"all_gather_rows: {len(rows)} rows here, the sizes say {sizes[self.rank]}")
        sizes_l = list(sizes)
        m = max(sizes_l)
        if rows.dtype == torch.int64 and values.dim() == 2 and values.element_size() == 4:
            return self._gather_rows_as_one(rows, values, sizes_l, m, async_op)
        pr = torch.zeros(m, dtype=rows.dtype, device=rows.device)
        pr[: len(rows)] = rows
        pv = torch.zeros(m, values.shape[1], dtype=values.dtype, device=values.device)
        pv[: len(rows)] = values
        gr = [torch.empty_like(pr) for _ in range(self.world)]
        gv = [torch.empty_like(pv) for _ in range(self.world)]
        h1 = dist.all_gather(gr, pr, async_op=async_op)
        h2 = dist.all_gather(gv, pv, async_op=async_op)

        def finish() -> tuple[torch.Tensor, torch.Tensor]:
            for h in (h1, h2):
                if h is not None:
                    h.wait()
            return (
                torch.cat([g[:s] for g, s in zip(gr, sizes_l)]),
                torch.cat([g[:s] for g, s in zip(gv, sizes_l)]),
            )

        return finish

    def _gather_rows_as_one(self, rows: torch.Tensor, values: torch.Tensor, sizes: list[int], m: int,
                            async_op: bool):
        """`start_all_gather_rows` in one all_gather instead of two (one collective latency
        less): each row is its int64 ID as two int32 words, then its 4-byte values bit for bit."""
        n, d = len(rows), values.shape[1]
        buf = torch.zeros(m, 2 + d, dtype=torch.int32, device=rows.device)
        buf[:n, :2] = rows.contiguous().view(torch.int32).view(n, 2)
        buf[:n, 2:] = values.contiguous().view(torch.int32)
        got = [torch.empty_like(buf) for _ in range(self.world)]
        h = dist.all_gather(got, buf, async_op=async_op)

        def finish() -> tuple[torch.Tensor, torch.Tensor]:
            if h is not None:
                h.wait()
            flat = torch.cat([g[:s] for g, s in zip(got, sizes)])
            return flat[:, :2].contiguous().view(torch.int64).view(-1), flat[:, 2:].contiguous().view(values.dtype)

        return finish

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()
