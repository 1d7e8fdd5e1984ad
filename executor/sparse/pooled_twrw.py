"""The fused, hierarchical pooled exchange of table-row-wise packs (Plan.exchange "fused_pooled").

What planner.pooled_twrw scores, run with torch.distributed. Nodes are rank groups of g
ranks (g: a member pack's ranks, one aligned block of the world); every member pack is
row-wise over one node. Per micro-batch, once every member of the group has handed in its
part, one collective per stage carries all of them:
- IDs: one all-to-all over all ranks: per destination, each member's cold IDs for it and,
  if it owns rows of the member, the member's bag lengths (executor.sparse.pooled's PooledPack
  prepares both per member);
- sums: each owner pools its rows per (requester, bag) (PooledPack.send_back's sum), a
  reduce-scatter inside the node (an all-to-all on the node's group, then a local sum:
  gloo has no reduce-scatter with these shapes) leaves local rank j the node's sums for the
  requesters of local index j, and one all-to-all among the peers (the ranks of local
  index j, one per node) brings every requester its bags' sums from every node;
- gradients: each requester's bag gradients go to the peer of every member's node (peers
  all-to-all), then are all-gathered inside the node (an all-to-all of one buffer to all),
  so each owner expands every requester's bag gradient to the lookups it served.
The member packs stay ordinary packs for the trainer (checkpoints, verify, updates); only
their collectives are shared. Fusion needs every member to hand in its part before any is
waited for: Plan.validate asks for overlap (micro_batches > 1 or kernel_interleaving),
where the trainer launches all exchanges of a stage before waiting on one.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from executor.sparse.pooled import PooledLookup, PooledPack
from planner.plan import PackPlan, Plan


class NodeGroups:
    """The process groups of the simulated nodes: this rank's node and its peers."""

    def __init__(self, world: int, rank: int, g: int) -> None:
        self.g, self.nodes = g, world // g
        self.local, self.node_index = rank % g, rank // g
        self.node = self.peers = None
        for n in range(self.nodes):  # every rank creates every group, in one order
            grp = dist.new_group(list(range(n * g, n * g + g))) if g > 1 else None
            if n == self.node_index:
                self.node = grp
        for j in range(g):
            grp = dist.new_group(list(range(j, world, g))) if self.nodes > 1 else None
            if j == self.local:
                self.peers = grp

    @staticmethod
    def a2a(group, out: torch.Tensor, inp: torch.Tensor, out_splits: list[int], in_splits: list[int],
            async_op: bool = False):
        if group is None:  # a group of one rank
            out.copy_(inp)
            return None
        return dist.all_to_all_single(out, inp, out_splits, in_splits, group=group, async_op=async_op)


class _Batch:
    """One stage of one micro-batch: the members' parts, then the launched collective."""

    def __init__(self, n: int) -> None:
        self.parts: list = [None] * n
        self.got = 0
        self.finish = None  # waits for the collective(s) and sets `results`
        self.results: list | None = None

    def wait(self) -> list:
        if self.finish is None:
            raise RuntimeError("fused pooled exchange: a member waited before every member sent its part "
                               "(the plan needs micro_batches > 1 or kernel_interleaving)")
        if self.results is None:
            self.results = self.finish()
        return self.results


class _Handle:
    def __init__(self, batch: _Batch, i: int, then=None) -> None:
        self.batch, self.i, self.then = batch, i, then

    def wait(self) -> bool:
        res = self.batch.wait()[self.i]
        if self.then is not None:
            self.then(res)
            self.then = None
        return True

    def is_completed(self) -> bool:
        return self.batch.results is not None


class Fuser:
    """The shared exchange of one group's member packs (module docstring)."""

    def __init__(self, members: list[PackPlan], world: int, rank: int, device: torch.device, dim: int,
                 id_dtype: torch.dtype = torch.int64) -> None:
        g = len(members[0].ranks or [])
        for p in members:
            r = list(p.ranks or [])
            if len(r) != g or r[0] % g or r != list(range(r[0], r[0] + g)) or world % g:
                raise ValueError(f"pack {p.name}: fused pooled members must each span one node of {g} ranks")
        self.world, self.rank, self.g, self.dev, self.dim = world, rank, g, device, dim
        self.id_dtype = id_dtype  # IDs and lengths on the wire (the group's widest member)
        self.names = [p.name for p in members]
        self.node_of = [p.ranks[0] // g for p in members]
        self.groups = NodeGroups(world, rank, g)
        self._open: dict[str, _Batch] = {}

    def _empty(self) -> torch.Tensor:
        return torch.zeros(0, device=self.dev)

    def _part(self, stage: str, i: int, part, launch) -> _Batch:
        b = self._open.get(stage)
        if b is None:
            b = self._open[stage] = _Batch(len(self.names))
        if b.parts[i] is not None:
            raise RuntimeError(f"fused pooled exchange: member {self.names[i]} sent twice in stage {stage}")
        b.parts[i], b.got = part, b.got + 1
        if b.got == len(self.names):
            del self._open[stage]
            b.finish = launch(b.parts)
        return b

    # ---- IDs and lengths --------------------------------------------------------------------
    def send_ids(self, i: int, lk: PooledLookup, owner: bool, async_op: bool, group=None) -> _Batch:
        """`group`: the process group of the exchange (None: the default one; the input
        pipeline's when the next batch's IDs go ahead of their step)."""
        return self._part("ids", i, (lk, owner), lambda parts: self._launch_ids(parts, async_op, group))

    def _launch_ids(self, parts: list, async_op: bool, group=None):
        W = self.world
        send, send_splits, recv_splits = [], [0] * W, [0] * W
        per_dest = []
        for (lk, _), node in zip(parts, self.node_of):
            ids = list(torch.split(lk.send_rows.to(self.id_dtype), lk.send_splits))
            lens = {}
            cold_lens = lk.cold_local.to(self.id_dtype)
            for k, d in enumerate(range(node * self.g, node * self.g + self.g)):
                lens[d] = cold_lens[k * lk.nbags : (k + 1) * lk.nbags]
            per_dest.append((ids, lens))
        for d in range(W):
            for ids, lens in per_dest:
                send.append(ids[d])
                send_splits[d] += len(ids[d])
                if d in lens:
                    send.append(lens[d])
                    send_splits[d] += len(lens[d])
        sizes = []  # per source: per member (IDs, lengths) received
        for s in range(W):
            row = [(lk.recv_splits[s], lk.nbags if owner else 0) for lk, owner in parts]
            sizes.append(row)
            recv_splits[s] = sum(a + b for a, b in row)
        out = torch.empty(sum(recv_splits), dtype=self.id_dtype, device=self.dev)
        inp = torch.cat(send) if send else torch.zeros(0, dtype=self.id_dtype, device=self.dev)
        work = dist.all_to_all_single(out, inp, recv_splits, send_splits, group=group, async_op=async_op)

        def finish() -> list:
            if work is not None:
                work.wait()
            flat = [n for row in sizes for a, b in row for n in (a, b)]
            pieces = torch.split(out, flat)
            res = []
            for m in range(len(parts)):
                ids = [pieces[(s * len(parts) + m) * 2] for s in range(W)]
                lens = [pieces[(s * len(parts) + m) * 2 + 1] for s in range(W)]
                res.append((torch.cat(ids).long(), torch.cat(lens).long()))
            return res

        return finish

    # ---- partial sums -----------------------------------------------------------------------
    def send_sums(self, i: int, pooled: torch.Tensor | None, nbags: int, async_op: bool) -> _Batch:
        return self._part("sums", i, (pooled, nbags), lambda parts: self._launch_sums(parts, async_op))

    def _launch_sums(self, parts: list, async_op: bool):
        G, g, nodes = self.groups, self.g, self.world // self.g
        dim = self.dim
        mine = [m for m, (p, _) in enumerate(parts) if p is not None]  # members of this node
        width = sum(nodes * parts[m][1] * dim for m in mine)  # floats for each local index
        views = [parts[m][0].view(nodes, g, parts[m][1], dim) for m in mine]
        inp = torch.cat([v[:, j].reshape(-1) for j in range(g) for v in views]) if mine else self._empty()
        out = torch.empty(g * width, device=self.dev)
        work = G.a2a(G.node, out, inp, [width] * g, [width] * g, async_op)

        def finish() -> list:
            if work is not None:
                work.wait()
            summed = out.view(g, width).sum(dim=0)  # the node's sums for this local index's requesters
            per_node = []  # to the peer of node n: each of this node's members' sums of its bags
            off = 0
            chunks = {}
            for m in mine:
                n_b = parts[m][1]
                chunks[m] = summed[off : off + nodes * n_b * dim].view(nodes, n_b, dim)
                off += nodes * n_b * dim
            for n in range(nodes):
                per_node.append(torch.cat([chunks[m][n].reshape(-1) for m in mine]) if mine else self._empty())
            send_splits = [len(x) for x in per_node]
            recv_splits = [sum(parts[m][1] * dim for m in range(len(parts)) if self.node_of[m] == n)
                           for n in range(nodes)]
            got = torch.empty(sum(recv_splits), device=self.dev)
            G.a2a(G.peers, got, torch.cat(per_node), recv_splits, send_splits)
            res: list = [None] * len(parts)
            off = 0
            for n in range(nodes):
                for m in range(len(parts)):
                    if self.node_of[m] == n:
                        k = parts[m][1] * dim
                        res[m] = got[off : off + k].view(parts[m][1], dim)
                        off += k
            return res

        return finish

    # ---- gradients --------------------------------------------------------------------------
    def send_grads(self, i: int, grad: torch.Tensor, owner: bool, async_op: bool) -> _Batch:
        return self._part("grads", i, (grad, owner), lambda parts: self._launch_grads(parts, async_op))

    def _launch_grads(self, parts: list, async_op: bool):
        G, g, nodes = self.groups, self.g, self.world // self.g
        dim = self.dim
        mine = [m for m, (_, own) in enumerate(parts) if own]
        send = [torch.cat([parts[m][0].reshape(-1) for m in range(len(parts)) if self.node_of[m] == n]
                          or [self._empty()]) for n in range(nodes)]
        send_splits = [len(x) for x in send]
        nb = {m: parts[m][0].shape[0] for m in range(len(parts))}
        per_peer = sum(nb[m] * dim for m in mine)
        got = torch.empty(nodes * per_peer, device=self.dev)
        work = G.a2a(G.peers, got, torch.cat(send), [per_peer] * nodes, send_splits, async_op)

        def finish() -> list:
            if work is not None:
                work.wait()
            everyone = torch.empty(g * nodes * per_peer, device=self.dev)
            G.a2a(G.node, everyone, got.repeat(g), [nodes * per_peer] * g, [nodes * per_peer] * g)
            blocks = everyone.view(g, nodes, per_peer)  # [local index j, node n] = source n*g + j
            res: list = [None] * len(parts)
            off = 0
            for m in mine:
                k = nb[m] * dim
                # source-major [W * nbags, dim], as the owner's received lookups are ordered
                res[m] = blocks[:, :, off : off + k].permute(1, 0, 2).reshape(nodes * g * nb[m], dim)
                off += k
            return res

        return finish


class FusedPooledPack(PooledPack):
    """A member of a fused group: PooledPack's per-pack work, the group's collectives."""

    fused = True

    def __init__(self, plan: Plan, pack: PackPlan, hot_ids, comm, fuser: Fuser, index: int) -> None:
        super().__init__(plan, pack, hot_ids, comm)
        if self.layout.mode == "none":
            raise ValueError(f"pack {self.name}: fused pooled exchange needs pooled tables")
        self.fuser, self.index = fuser, index

    def send_ids(self, lk: PooledLookup, async_op: bool) -> None:
        def got(res) -> None:
            lk.recv_rows, lk.recv_lengths = res

        lk.handle = _Handle(self.fuser.send_ids(self.index, lk, self.owner, async_op, self.comm.group), self.index, got)

    def send_back(self, lk: PooledLookup, rows: torch.Tensor | None, async_op: bool) -> None:
        """Owner: sum the received rows per (source, bag), hand them to the group's reduce."""
        lk.handle.wait()
        pooled = self.owner_sums(lk, rows) if self.owner else None

        def got(res) -> None:
            lk.cold_sum = res

        lk.handle = _Handle(self.fuser.send_sums(self.index, pooled, lk.nbags, async_op), self.index, got)

    def assemble(self, lk: PooledLookup, cold: torch.Tensor | None = None) -> torch.Tensor:
        lk.handle.wait()
        return lk.unique_emb + lk.cold_sum

    def backward(self, lk: PooledLookup, g: torch.Tensor, async_op: bool) -> None:
        self.hot_backward(lk, g)
        h = _Handle(self.fuser.send_grads(self.index, g.float().contiguous(), self.owner, async_op), self.index)
        self.grad_handles.append((h, lk.recv_rows, None, lk.recv_bag))

    def wait_grads(self) -> None:
        for h, rows, _, bag in self.grad_handles:
            h.wait()
            self.owe(rows, h.batch.results[h.i], bag)
        self.grad_handles = []
