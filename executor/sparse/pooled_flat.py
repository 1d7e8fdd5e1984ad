"""The fused, flat pooled exchange of a run of packs, as TorchRec runs its own plan (Plan.exchange "torchrec").

TorchRec looks up all tables of one sharding type in one kernel and moves them in one
collective per stage; its plan converted to ours (planner.torchrec_bridge) is a run of
packs per sharding type, and planner.plan.fused_runs names the runs that lowering scores
as one exchange. A run of pooled packs runs here the same way: once every member has handed
in its part of a stage, one all-to-all over all ranks carries every member's part:
- IDs: per destination, each member's cold IDs for it and, where it owns rows of the member,
  the member's bag lengths (executor.sparse.pooled's PooledPack prepares both per member);
- sums: each owner's per-(requester, bag) sums of every member it owns; the requester adds
  the owners' sums of a bag in owner order, as PooledPack.assemble does;
- gradients: each requester's bag gradients of every member to each of its owners, which
  receive them source-major, as PooledPack's own exchange leaves them.
The members stay ordinary packs (checkpoints, verify, updates), each the FusedPooledPack of
executor.sparse.pooled_twrw with this module's Fuser; the numbers are those of the per-pack
exchange, in the same order, so the weights are the same bit for bit. Without overlap the
trainer issues a fused run stage by stage all the same (it waits for a member only once the
run's collective is launched).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.sparse.pooled_twrw import Fuser


class FlatFuser(Fuser):
    """The shared exchange of one run's member packs (module docstring). `owners`: per member,
    the ranks holding its rows, ascending (a table-wise member has one); `dims`: per member,
    its rows' width."""

    def __init__(self, names: list[str], owners: list[list[int]], dims: list[int], world: int, rank: int,
                 device: torch.device, id_dtype: torch.dtype = torch.int64) -> None:
        self.world, self.rank, self.dev, self.id_dtype = world, rank, device, id_dtype
        self.names = list(names)
        self.owners = [sorted(o) for o in owners]
        self.dims = list(dims)
        self._open = {}

    @staticmethod
    def _a2a(out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int], async_op: bool,
             group=None):
        """Launch one all-to-all; the returned wait() returns once it is done (at once if synchronous)."""
        work = dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)
        return work.wait if work is not None else (lambda: None)

    # ---- IDs and lengths --------------------------------------------------------------------
    def _launch_ids(self, parts: list, async_op: bool, group=None):
        W = self.world
        send: list[list[torch.Tensor]] = [[] for _ in range(W)]
        for m, (lk, _) in enumerate(parts):
            ids = torch.split(lk.send_rows.to(self.id_dtype), lk.send_splits)
            lens = lk.cold_local.to(self.id_dtype)  # nbags per owner, owners ascending
            for d in range(W):
                send[d].append(ids[d])
            for k, d in enumerate(self.owners[m]):
                send[d].append(lens[k * lk.nbags : (k + 1) * lk.nbags])
        send_splits = [sum(len(t) for t in row) for row in send]
        # from each source: per member its IDs for this rank, then (an owner) its lengths
        sizes = [[(lk.recv_splits[s], lk.nbags if self.rank in self.owners[m] else 0)
                  for m, (lk, _) in enumerate(parts)] for s in range(W)]
        recv_splits = [sum(a + b for a, b in row) for row in sizes]
        out = torch.empty(sum(recv_splits), dtype=self.id_dtype, device=self.dev)
        flat = [t for row in send for t in row]
        inp = torch.cat(flat) if flat else torch.zeros(0, dtype=self.id_dtype, device=self.dev)
        wait = self._a2a(out, inp, recv_splits, send_splits, async_op, group)

        def finish() -> list:
            wait()
            pieces = torch.split(out, [n for row in sizes for ab in row for n in ab])
            M = len(parts)
            return [(torch.cat([pieces[(s * M + m) * 2] for s in range(W)]).long(),
                     torch.cat([pieces[(s * M + m) * 2 + 1] for s in range(W)]).long()) for m in range(M)]

        return finish

    # ---- partial sums -----------------------------------------------------------------------
    def _launch_sums(self, parts: list, async_op: bool):
        W = self.world
        mine = [m for m, (pooled, _) in enumerate(parts) if pooled is not None]
        # to requester s: the sums of its bags of every member owned here, member by member
        send = [torch.cat([parts[m][0][s * parts[m][1] : (s + 1) * parts[m][1]].reshape(-1) for m in mine])
                if mine else self._empty() for s in range(W)]
        send_splits = [len(t) for t in send]
        width = [parts[m][1] * self.dims[m] for m in range(len(parts))]
        recv_splits = [sum(width[m] for m in range(len(parts)) if o in self.owners[m]) for o in range(W)]
        out = torch.empty(sum(recv_splits), device=self.dev)
        wait = self._a2a(out, torch.cat(send), recv_splits, send_splits, async_op)

        def finish() -> list:
            wait()
            at = {}  # (owner, member) -> offset in out
            off = 0
            for o in range(W):
                for m in range(len(parts)):
                    if o in self.owners[m]:
                        at[o, m] = off
                        off += width[m]
            res = []
            for m, (_, nbags) in enumerate(parts):
                # the owners' sums contiguous, [owners, nbags, dim], summed over owners as
                # PooledPack.assemble sums its one buffer
                got = torch.cat([out[at[o, m] : at[o, m] + width[m]] for o in self.owners[m]])
                res.append(got.view(len(self.owners[m]), nbags, self.dims[m]).sum(dim=0))
            return res

        return finish

    # ---- gradients --------------------------------------------------------------------------
    def _launch_grads(self, parts: list, async_op: bool):
        W = self.world
        send: list[list[torch.Tensor]] = [[] for _ in range(W)]
        for m, (g, _) in enumerate(parts):
            for d in self.owners[m]:
                send[d].append(g.reshape(-1))
        send_splits = [sum(len(t) for t in row) for row in send]
        mine = [m for m in range(len(parts)) if self.rank in self.owners[m]]
        width = {m: parts[m][0].numel() for m in mine}  # every source sends the same bags
        per_src = sum(width.values())
        out = torch.empty(W * per_src, device=self.dev)
        flat = [t for row in send for t in row]
        inp = torch.cat(flat) if flat else self._empty()
        wait = self._a2a(out, inp, [per_src] * W, send_splits, async_op)

        def finish() -> list:
            wait()
            blocks = out.view(W, per_src)
            res: list = [None] * len(parts)
            off = 0
            for m in mine:
                # source-major [W * nbags, dim], as the owner's received lookups are ordered
                res[m] = blocks[:, off : off + width[m]].reshape(-1, self.dims[m])
                off += width[m]
            return res

        return finish
