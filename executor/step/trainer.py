"""One rank's training step: distributed embeddings + replicated dense model.

The loss is the mean BCE over the global batch: each rank adds the BCE sum of its rows
divided by the global batch size, micro-batches accumulate gradients, and one update
follows the last micro-batch, so any plan computes the same step as the reference.

Overlap (on when the plan asks for kernel interleaving or micro_batches > 1): all ID
exchanges are launched before any is waited on, the owners' gathers and row returns
follow, and each micro-batch's gradient exchange is in flight while the next one
computes; the one all-reduce of the dense and hot-row gradients overlaps the cold updates.
The dense forward runs at the model's dense_dtype where the device has it (executor.dense.precision).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F

from executor.comm import Comm, Done
from executor.data.batches import Batch
from executor.dense import padding
from executor.dense.compiled import DenseCompile, compile_dense
from executor.dense.compute_weights import ComputeWeights, wanted
from executor.dense.model import DenseArch, build_dense
from executor.dense.optim import DenseOptimizer
from executor.dense.precision import apply_global, dense_precision
from executor.sparse.embedding import Lookup, assemble_pieces
from executor.sparse.exchange_check import ExchangeCounts
from executor.sparse.pack_groups import make_packs
from executor.sparse.protocol import PackExchange
from executor.step.timing import OpTimer
from planner.dense import dense_cost
from planner.grad_buckets import early_buckets
from planner.model_spec import ModelSpec
from planner.plan import Plan
from planner.sharding import Sharding
from simulator.measured import BUCKET_LANE, INPUT_LANE, SYNC_LANE


def make_dense_optimizer(plan: Plan, params, logical_shapes: list[tuple[int, ...]] | None = None) -> DenseOptimizer:
    o = plan.optimizer
    return DenseOptimizer(params, o.dense, o.dense_lr, o.eps, logical_shapes=logical_shapes)


def backward_with(out: torch.Tensor, grad: torch.Tensor) -> None:
    """out.backward(grad), written as a scalar backward: exact (d sum(out * g) / d out = g), and it
    keeps autograd from importing sympy for the shape check of an explicit gradient (seconds)."""
    (out * grad).sum().backward()


def pad_sequences(flat: torch.Tensor, offsets: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-item embeddings [nnz, D] of CSR bags -> (padded [n, max_len, D], mask [n, max_len])."""
    lens = offsets[1:] - offsets[:-1]
    n = len(lens)
    # output sizes given: repeat_interleave would otherwise read the total back from the device
    bag = torch.repeat_interleave(torch.arange(n, device=flat.device), lens, output_size=len(flat))
    pos = torch.arange(len(flat), device=flat.device) - torch.repeat_interleave(offsets[:-1], lens, output_size=len(flat))
    padded = torch.zeros(n, max_len, flat.shape[1], dtype=flat.dtype, device=flat.device).index_put((bag, pos), flat)
    mask = torch.zeros(n, max_len, dtype=flat.dtype, device=flat.device)
    mask[bag, pos] = 1.0
    return padded, mask


def dense_step_inputs(model, tables: list[str], out: torch.Tensor, mb: Batch, embs: dict, seqs: dict) -> list:
    """Split one pack's output (bags table-major) into the model's per-table inputs.

    Each table's piece is its own autograd leaf (returned, in order): the pack's gradient is
    their gradients concatenated. Slicing one leaf instead would make autograd build and add
    one full-size zero-padded gradient per table (it dominated DLRM's dense backward)."""
    n = len(mb)
    off = 0
    leaves = []
    for t in tables:
        spec = model.table(t)
        size = len(mb.sparse[t][0]) if spec.pooling == "none" else n
        piece = out[off : off + size].detach().requires_grad_()
        leaves.append(piece)
        if spec.pooling == "none":
            seqs[t] = pad_sequences(piece, mb.sparse[t][1], spec.max_len)
        else:
            embs[t] = piece
        off += size
        if mb.pad_bags:  # the padding's bag: a leaf of its own that the loss never reads (zero gradient)
            leaves.append(out[off : off + 1].detach().requires_grad_())
            off += 1
    return leaves


def leaves_grad(leaves: list[torch.Tensor]) -> torch.Tensor:
    """The pack's output gradient from its per-table leaves (zeros for a table the loss ignores).
    Gradients that already lie end to end in one buffer (the native interaction's backward
    writes them so) are returned as one view of it instead of being copied."""
    joined = grads_in_place(leaves)
    if joined is not None:
        return joined
    grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in leaves]
    joined = adjacent_view(grads)
    return joined if joined is not None else torch.cat(grads)


def grads_in_place(leaves: list[torch.Tensor]) -> torch.Tensor | None:
    """The leaves' gradients as one view when they lie in one buffer laid out as the leaves lie
    in theirs (the Triton interaction's backward writes them so); rows of leaves without a
    gradient (the padding bags) are zeroed in that buffer, which no other tensor reads. None
    when they do not."""
    have = [q for q in leaves if q.grad is not None]
    if not have or any(not q.is_contiguous() or not q.grad.is_contiguous() for q in leaves if q.grad is not None):
        return None
    try:
        buf = have[0].grad.untyped_storage()
        ptr = buf.data_ptr()
        start = leaves[0].storage_offset()
        shift = have[0].grad.storage_offset() - have[0].storage_offset()
    except (RuntimeError, NotImplementedError):
        return None
    off = start
    for q in leaves:
        if not q.is_contiguous() or q.storage_offset() != off:
            return None  # the leaves themselves are not end to end
        off += q.numel()
    for q in have:
        g = q.grad
        if g.untyped_storage().data_ptr() != ptr or g.storage_offset() - q.storage_offset() != shift \
                or g.dtype != q.dtype or g.shape != q.shape:
            return None
    if shift + start < 0 or (shift + off) * have[0].grad.element_size() > buf.nbytes():
        return None
    first = have[0].grad
    whole = first.new_empty(0).set_(buf, start + shift, (off - start,)).view(-1, *first.shape[1:])
    for q in leaves:
        if q.grad is None:
            n = q.numel()
            whole.view(-1)[q.storage_offset() - start : q.storage_offset() - start + n].zero_()
    return whole


def adjacent_view(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """torch.cat(parts) as a view when the contiguous parts are consecutive in one storage, else None."""
    first = parts[0]
    if not all(p.is_contiguous() and p.dtype == first.dtype and p.shape[1:] == first.shape[1:] for p in parts):
        return None
    try:
        ptr, off = first.untyped_storage().data_ptr(), first.storage_offset()
    except (RuntimeError, NotImplementedError):
        return None
    for p in parts:
        if p.untyped_storage().data_ptr() != ptr or p.storage_offset() != off:
            return None
        off += p.numel()
    rows = sum(p.shape[0] for p in parts)
    return first.new_empty(0).set_(first.untyped_storage(), first.storage_offset(), (rows, *first.shape[1:]))


def _zero_missing_grads(params: list[torch.nn.Parameter]) -> None:
    """A zero gradient for each weight the step did not reach (the optimizer updates every weight)."""
    for q in params:
        if q.grad is None:
            q.grad = torch.zeros_like(q)


def _flat_grads(params: list[torch.nn.Parameter], tail: Sequence[torch.Tensor] = ()) -> torch.Tensor:
    """The gradients of `params` (zero for a weight the step did not reach), then `tail`, in
    one flat buffer for an all-reduce."""
    _zero_missing_grads(params)
    return torch.cat([q.grad.reshape(-1) for q in params] + list(tail))


def _unflat_grads(params: list[torch.nn.Parameter], flat: torch.Tensor) -> None:
    """Copy the reduced gradients back from the head of `flat` (as `_flat_grads` laid them)."""
    off = 0
    for q in params:
        n = q.numel()
        q.grad.copy_(flat[off : off + n].view_as(q))
        off += n


@dataclass
class _DenseForward:
    """One micro-batch's dense forward, stage by stage: the bottom MLP's output and its
    detached copy (the interaction's input), the interaction's likewise, and the loss."""

    b: torch.Tensor
    bd: torch.Tensor
    z: torch.Tensor
    zd: torch.Tensor
    loss: torch.Tensor


@dataclass
class _Inputs:
    """A step's lookups once routed and sized: `source`, the rows they came from (the batch
    object the step is given), its micro-batches, each micro-batch's lookups per pack."""

    source: Batch
    mbs: list[Batch]
    lks: list[list[Lookup]]
    first: tuple[int, int] | None  # the first exchanging lookup, whose span holds the sizes exchange
    first_tok: object = None
    hot_sizes: dict[int, list[int]] = field(default_factory=dict)  # sparse hot packs' all-gather sizes
    sent: bool = False  # the IDs went ahead (input pipeline)


@dataclass
class _GradSync:
    """A step's gradient collectives once launched: the flat all-reduced gradients (None on one
    rank) and their work, and the open op spans of replicated and sparse hot packs' syncs."""

    flat: torch.Tensor | None = None
    work: object = None
    replica_toks: dict[str, object] = field(default_factory=dict)
    hot_toks: dict[str, object] = field(default_factory=dict)


class Trainer:
    def __init__(self, plan: Plan, hot_ids: dict[str, np.ndarray], comm: Comm, timer: OpTimer | None = None) -> None:
        plan.validate()
        if comm.world != plan.world_size:
            raise ValueError(f"the plan is for {plan.world_size} ranks, this run has {comm.world}")
        self.plan = plan
        self.comm = comm
        self.dev = comm.device
        self.packs: list[PackExchange] = make_packs(plan, hot_ids, comm)  # fused pooled groups share their collectives
        self.dense: DenseArch = build_dense(plan.model, plan.seed).to(self.dev)
        # the dense layers' precision as the planner costed it, where this device has it
        self.precision = dense_precision(plan.model.dense_precision, self.dev)
        pad = padding.run_dtype(self.dev, self.precision.used)  # CUDA: GEMM operands widened onto tensor cores
        if pad is not None:
            self.dense.pad_gemm_inputs(pad)
        self.compiled_stages = compile_dense(self.dense, DenseCompile.from_env())  # PICASSO_DENSE_COMPILE
        self.opt = make_dense_optimizer(plan, self.dense.parameters(), padding.logical_shapes(self.dense))
        apply_global(self.precision)
        self.overlap = plan.overlapped
        self.timer = timer or OpTimer(comm.rank, self.dev, enabled=False, micro_batches=plan.micro_batches)
        self.steps_done = 0
        self._ahead: _Inputs | None = None  # the next step's lookups, gone ahead (input pipeline)
        self.exchanged = ExchangeCounts()  # cold/hot rows per pack and micro-batch (executor.sparse.exchange_check)
        if plan.pipelines_inputs:
            comm.open_input_group()
        # grad_bucket_mb: the buckets launched during the last micro-batch's backward, as
        # (name, last stage, parameters); the layout is lowering's (planner.grad_buckets)
        self._early: list[tuple[str, str, list[torch.nn.Parameter]]] = []
        self._flying: list[tuple[list[torch.nn.Parameter], torch.Tensor, object]] = []
        if plan.buckets_grads:
            by_stage = self.dense.stage_parameters()
            for name, stages in early_buckets(dense_cost(plan.model), plan.grad_bucket_mb):
                self._early.append((name, stages[-1], [q for s in stages for q in by_stage[s]]))
            comm.open_grad_groups()
        # the dense parameters of the step's one all-reduce: those of no early bucket
        early = {id(q) for _, _, params in self._early for q in params}
        self._synced = [q for q in self.dense.parameters() if id(q) not in early]
        # bf16 on CUDA: the forward reads bf16 copies of the fp32 masters, refreshed after each update
        self.weights = (ComputeWeights(self.dense) if wanted(self.dev, self.precision.used, plan.micro_batches,
                                                              bool(self._early)) else None)

    # ---- one step -------------------------------------------------------------------
    def step(self, local: Batch, upcoming: Batch | None = None) -> torch.Tensor:
        """Train on this rank's rows of one global batch; returns its share of the mean loss
        (a 0-dim tensor on the device: reading it would make the host wait for the step).

        On several ranks the step reads the device once: the rows every lookup sends to each
        rank (`_exchange_sizes`). Nothing else waits for the device.

        With the plan's input_pipeline, `upcoming` (the next step's rows, when there is one)
        is copied, deduplicated and routed once this step's gathers are issued, and its IDs
        go to their owners on the input process group after the pooling of micro-batch
        `plan.ids_launch_mb` (by default the last: the forward exchanges the step waits for
        go first); the next step then starts from those lookups (TorchRec's
        TrainPipelineSparseDist). The IDs are data, not parameters: the step computes the same.

        The stages below run in this order, each a method: inputs, the packs' forward
        exchanges, the dense forward/backward with the packs' backward, the gradient sync, the
        updates (cold, hot, dense)."""
        inputs = self._step_inputs(local)
        self._launch_lookups(inputs)
        # the next step's lookups are routed now, beside this step's exchanges
        if self.plan.pipelines_inputs and upcoming is not None:
            self._ahead = self._route(upcoming, self._split(upcoming))
        loss_sum = self._forward_backward(inputs)
        sync = self._start_grad_sync()
        self._update_cold(sync)
        sync.work.wait()
        self._update_hot(sync)
        self._update_dense(sync)
        self.steps_done += 1
        return loss_sum

    def _step_inputs(self, local: Batch) -> _Inputs:
        """The step's input and buffers: its rows copied (a no-op when the loader already did,
        or when they went ahead) and split into micro-batches, the gradient buffers zeroed,
        every lookup deduplicated, routed and sized (done already when its IDs went ahead)."""
        plan, T = self.plan, self.timer
        if len(local) != plan.batch_size_per_rank:
            raise ValueError(f"expected {plan.batch_size_per_rank} rows per rank, got {len(local)}")
        ahead, self._ahead = self._ahead, None
        if ahead is not None and (ahead.source is not local or not ahead.sent):
            raise RuntimeError("input pipeline: the step's rows are not the ones whose IDs went ahead")
        with T.op("fwd", "input", "h2d"):  # lowering's fwd/input/h2d carries the copy, split and zeroing
            mbs = ahead.mbs if ahead is not None else self._split(local)
            self.opt.zero_grad(set_to_none=False)
            for p in self.packs:
                p.zero_grad()
                p.step_index = self.steps_done
        if ahead is not None:
            inputs = ahead
        else:
            inputs = self._route(local, mbs)
            self._size(inputs, lane="comm")
        for j, sizes in inputs.hot_sizes.items():
            self.packs[j].hot_sizes = sizes
        for j, p in enumerate(self.packs):
            if p.replicated and self.comm.world > 1:  # every rank's cold rows size the gradient all-gather
                p.replica_sizes = [sum(row[j].recv_splits[r] for row in inputs.lks) for r in range(self.comm.world)]
        return inputs

    def _launch_lookups(self, inputs: _Inputs) -> None:
        """The packs' forward exchanges: hot reads and every ID exchange launched (gone ahead
        already with the input pipeline), then the owners gather and return rows."""
        T, ov, lks, k = self.timer, self.overlap, inputs.lks, self.plan.micro_batches
        for i in range(k):
            for j, p in enumerate(self.packs):
                lk = lks[i][j]
                if p.num_hot:
                    with T.op("fwd", p.name, "hot_gather", i):
                        p.hot_gather(lk)
                else:  # no hot rows: only the buffer of unique rows (lowering has no op for it)
                    p.hot_gather(lk)
                if p.local_only:
                    continue
                if not inputs.sent:
                    self._send_ids(inputs, i, j, "comm", async_op=ov)
                if not ov and not p.fused:
                    self._gather(p, lk, i)
        # in overlap mode the owners gather while other exchanges fly; the members of a fused
        # exchange once all of them have sent their IDs, in any mode
        for i in range(k):
            for j, p in enumerate(self.packs):
                if not p.local_only and (ov or p.fused):
                    self._gather(p, lks[i][j], i)

    def _forward_backward(self, inputs: _Inputs) -> torch.Tensor:
        """Per micro-batch: pool, dense forward/backward, launch the packs' gradient exchange (a
        layered backward: every forward first, then the backward layer by layer); returns the
        loss summed over the micro-batches."""
        plan, lks = self.plan, inputs.lks
        # every micro-batch's bottom MLP reads the dense features only: run while rows fly
        bottoms = [self._bottom_forward(mb, i) for i, mb in enumerate(inputs.mbs)]
        loss_sum = torch.zeros((), device=self.dev)
        held: list[tuple[list, _DenseForward]] = []
        for i, mb in enumerate(inputs.mbs):
            embs, seqs, leaves = self._pool(lks, i, mb)
            if i == plan.ids_launch_mb and self._ahead is not None:  # the next step's IDs go
                self._send_ahead(self._ahead)
            b, bottoms[i] = bottoms[i], None
            if plan.layered_backward:
                f = self._dense_forward(mb, b, embs, seqs, i)
                held.append((leaves, f))
                loss_sum = loss_sum + f.loss.detach()
                continue
            loss_sum = loss_sum + self._dense(mb, b, embs, seqs, i)
            self._packs_backward(lks, leaves, i)
        if held:
            self._layered_backward(lks, held)
        return loss_sum

    def _start_grad_sync(self) -> _GradSync:
        """Launch the step's gradient collectives: replicated packs' row gradients first (gloo
        runs collectives in launch order, and the cold updates wait for them), then sparse hot
        packs' touched rows, then one all-reduce of the dense gradients and every other pack's
        hot-row gradients (hot rows are data-parallel parameters, as in P2RES): one collective
        latency per step."""
        T, ov = self.timer, self.overlap
        sync = _GradSync()
        for p in self.packs:
            if p.replicated:  # lowering: one all_gather + apply, named opt/<pack>/cold_update
                sync.replica_toks[p.name] = T.start("opt", p.name, "cold_update", lane="comm")
                p.start_replicated_sync(async_op=ov)
        for p in self.packs:  # launched before the all-reduce: the hot updates wait for them
            if p.sparse_hot:
                sync.hot_toks[p.name] = T.start("opt", p.name, "hot_sync", lane="comm")
                p.start_hot_sync(async_op=ov)
        if self.weights is not None:
            self.weights.grads_to_masters()
        dtok = T.start("bwd", "dense", "allreduce", lane=SYNC_LANE if self.plan.buckets_grads else "comm")
        sync.flat, sync.work = self._start_grad_allreduce(ov)
        T.end_when_done(dtok, sync.work)
        return sync

    def _update_cold(self, sync: _GradSync) -> None:
        """Each pack's cold rows updated once its gradients are in. Replicated packs first: their
        all-gather was launched last, so waiting for it waits for nothing else, and its span
        (launch to the gathered rows) holds no other pack's update; the apply that follows is
        host work of the same op."""
        T = self.timer
        for p in sorted(self.packs, key=lambda q: not q.replicated):
            p.wait_grads()
            if p.replicated:
                tok = sync.replica_toks.pop(p.name)
                p.apply_cold(on_gathered=lambda tok=tok: T.end(tok))
                continue
            with T.op("opt", p.name, "cold_update"):
                p.apply_cold()

    def _update_hot(self, sync: _GradSync) -> None:
        """Each pack's hot rows updated: from its sparse all-gather, or from its slice of the
        reduced flat gradients (which follow the dense ones)."""
        T, flat = self.timer, sync.flat
        off = sum(q.numel() for q in self._synced)
        for p in self.packs:
            if p.sparse_hot:
                synced = p.finish_hot_sync()
                T.end(sync.hot_toks.pop(p.name))
                with T.op("opt", p.name, "hot_update"):
                    p.apply_hot(synced)
            elif p.num_hot:
                with T.op("opt", p.name, "hot_update"):
                    n = p.hot_grad.numel()
                    if flat is not None:  # one rank: the gradient is already the sum
                        p.hot_grad.copy_(flat[off : off + n].view_as(p.hot_grad))
                    off += n
                    p.apply_hot()

    def _update_dense(self, sync: _GradSync) -> None:
        """The dense update, the bf16 copies refreshed where the run keeps them."""
        with self.timer.op("opt", "dense", "update"):  # the copy back of the reduced gradients is the update's
            self._finish_dense_allreduce(sync.flat)
            self.opt.step()
            if self.weights is not None:
                self.weights.refresh()

    def _split(self, local: Batch) -> list[Batch]:
        local = local.to(self.dev)
        if self.plan.micro_batches == 1:  # the whole batch: nothing to cut (nor any padding to drop)
            return [local]
        m = len(local) // self.plan.micro_batches
        return [local.slice(i * m, (i + 1) * m) for i in range(self.plan.micro_batches)]

    def _route(self, source: Batch, mbs: list[Batch]) -> _Inputs:
        """Dedup and route every lookup of a step's micro-batches."""
        T = self.timer
        lks: list[list[Lookup]] = [[None] * len(self.packs) for _ in mbs]
        for i, mb in enumerate(mbs):
            for j, p in enumerate(self.packs):
                with T.op("fwd", p.name, p.op("dedup"), i):
                    idx, offs = p.pack_inputs(mb.sparse, mb.pad_bags)
                    lk = p.dedup(idx, offs)
                    if mb.pad_bags:  # each table's bags: one per sample, then its padding's
                        lk.pad_every = len(mb) + 1
                with T.op("fwd", p.name, "route", i):
                    p.prepare(lk)
                lks[i][j] = lk
        # lowering counts the sizes exchange in the first ID exchange's span
        first = next(((i, j) for i in range(len(mbs)) for j, p in enumerate(self.packs) if not p.local_only), None)
        return _Inputs(source, mbs, lks, first)

    def _size(self, inputs: _Inputs, lane: str) -> None:
        """Exchange the sizes of every exchange of a routed step, timed in the first ID
        exchange's span on `lane` (it ends when that exchange does)."""
        if self.comm.world > 1:
            if inputs.first is not None:
                i, j = inputs.first
                inputs.first_tok = self.timer.start("fwd", self.packs[j].name, "a2a_ids", i, lane=lane)
            inputs.hot_sizes = self._exchange_sizes(inputs.lks)

    def _send_ahead(self, ahead: _Inputs) -> None:
        """The input pipeline: the next step's routed lookups sized and their IDs launched on
        the input process group (lane INPUT_LANE, as lowering has it)."""
        with self.comm.inputs():
            self._size(ahead, lane=INPUT_LANE)
            for i in range(len(ahead.lks)):
                for j, p in enumerate(self.packs):
                    if not p.local_only:
                        self._send_ids(ahead, i, j, INPUT_LANE, async_op=True)
        ahead.sent = True

    def _send_ids(self, inputs: _Inputs, i: int, j: int, lane: str, async_op: bool) -> None:
        """Launch micro-batch i's ID exchange of pack j, timed on `lane` from its launch to its
        end (the exchange's own span, not the wait for it); the first one's span already holds
        the sizes exchange."""
        T, p, lk = self.timer, self.packs[j], inputs.lks[i][j]
        tok = inputs.first_tok if (i, j) == inputs.first else T.start("fwd", p.name, "a2a_ids", i, lane=lane)
        p.send_ids(lk, async_op=async_op)
        T.end_when_done(tok, lk.handle)

    def _exchange_sizes(self, lks: list[list[Lookup]], count: bool = True) -> dict[int, list[int]]:
        """Every lookup's rows per destination go to the destinations in one all-to-all, and the
        counts plus what each rank will send here come back to the host in one read. `count`:
        training lookups, added to `exchanged` (an evaluation's are not)."""
        entries = [(p, lk) for row in lks for p, lk in zip(self.packs, row)]
        world = self.comm.world
        cols = [p.send_counts(lk) for p, lk in entries]  # per lookup: rows to each rank
        # sparse hot sync: each such pack's touched hot rows, told to every rank (the sizes
        # of its all-gather), in the same exchange and the same read
        sparse = [(j, p) for j, p in enumerate(self.packs) if p.sparse_hot]
        cols += [p.hot_count([row[j] for row in lks]).expand(world) for j, p in sparse]
        recv = self.comm.exchange_counts(torch.stack(cols, dim=1))  # [world, columns] from each source
        host = torch.cat([lk.route.counts for _, lk in entries] + [recv.reshape(-1)]).tolist()
        e_n, n_cols = len(entries), len(cols)
        recv_h = host[len(host) - world * n_cols :]
        off = 0
        for e, (p, lk) in enumerate(entries):
            n = p.num_owners + 1
            counts = host[off : off + n]  # cold rows per owner, then the hot ones
            if count:
                self.exchanged.add(p.name, sum(counts[:-1]), counts[-1])
            p.place(lk, counts, [recv_h[src * n_cols + e] for src in range(world)])
            off += n
        # per sparse hot pack: each rank's touched hot rows (set on the pack by the step they are for)
        return {j: [recv_h[src * n_cols + e_n + x] for src in range(world)] for x, (j, _) in enumerate(sparse)}

    def _read_local(self, p: PackExchange, lk: Lookup, i: int) -> torch.Tensor:
        """A lookup without exchange reads its cold rows: cold_gather; from host memory, the
        host gather (cold_gather) and the PCIe copy (cold_h2d) as lowering has them."""
        T = self.timer
        if not p.host:
            with T.op("fwd", p.name, "cold_gather", i):
                return p.assemble(lk)
        with T.op("fwd", p.name, "cold_gather", i):
            staged = p.host_gather_local(lk)
        with T.op("fwd", p.name, "cold_h2d", i):
            return p.assemble(lk, p.copy_rows(staged))

    def _gather(self, p: PackExchange, lk: Lookup, i: int) -> None:
        lk.handle.wait()
        T = self.timer
        # the rows' return is launched asynchronously and, without overlap, waited for at
        # once (what a synchronous exchange does): cold_gather times the gather and the
        # launch, a2a_emb the exchange, as lowering has them one after the other; from host
        # memory the gather is two ops, the host gather and the PCIe copy (cold_h2d)
        if p.host:
            with T.op("fwd", p.name, p.op("cold_gather"), i):
                staged = p.host_gather(lk.recv_rows)
            with T.op("fwd", p.name, "cold_h2d", i):
                p.send_back(lk, p.copy_rows(staged), async_op=True)
        else:
            with T.op("fwd", p.name, p.op("cold_gather"), i):
                p.gather(lk, async_op=True)
        tok = T.start("fwd", p.name, p.op("a2a_emb"), i, lane="comm")
        T.end_when_done(tok, lk.handle)
        if not self.overlap and not p.fused:  # a fused member's collective waits for the others
            lk.handle.wait()

    def _pool(self, lks: list[list[Lookup]], i: int, mb: Batch) -> tuple[dict, dict, list]:
        """Micro-batch i's rows pooled per pack, as the dense model's inputs (embs, seqs) and
        each pack's autograd leaves."""
        T = self.timer
        embs: dict = {}
        seqs: dict = {}
        leaves = []
        for j, p in enumerate(self.packs):
            lk = lks[i][j]
            if p.local_only:  # a replica (or the only rank) reads its rows locally: cold_gather
                u = self._read_local(p, lk, i)
            else:
                lk.handle.wait()
            with T.op("fwd", p.name, "pool", i):
                if not p.local_only:
                    u = p.assemble(lk)
                out = p.pool(lk, u)
            leaves.append(dense_step_inputs(self.plan.model, p.layout.tables, out, mb, embs, seqs))
        return embs, seqs, leaves

    def _packs_backward(self, lks: list[list[Lookup]], leaves: list, i: int) -> None:
        """Micro-batch i's pooled gradients back to the packs; launch their gradient exchange."""
        T = self.timer
        for j, p in enumerate(self.packs):
            lk = lks[i][j]
            with T.op("bwd", p.name, "pool", i):
                g = leaves_grad(leaves[j])
                gu = p.unique_grad(lk, g)
            tok = None if p.local_only else T.start("bwd", p.name, p.op("a2a_grad"), i, lane="comm")
            p.backward(lk, gu, async_op=self.overlap)
            if tok is not None:
                T.end_when_done(tok, p.grad_handles[-1][0])
            lks[i][j] = None  # free the micro-batch's buffers

    def _compute(self) -> contextlib.AbstractContextManager:
        """The dense forward's context: the plan's precision (autocast), on the 16-bit weight
        copies where the run keeps them."""
        if self.weights is None:
            return self.precision.autocast(self.dev)
        stack = contextlib.ExitStack()
        stack.enter_context(self.precision.autocast(self.dev))
        stack.enter_context(self.weights.swapped())
        return stack

    def _bottom_forward(self, mb: Batch, i: int) -> torch.Tensor:
        """Micro-batch i's bottom MLP output, its autograd graph kept for the backward."""
        with self.timer.op("fwd", "dense", "bottom_mlp", i), self._compute():
            return self.dense.bottom(mb.dense)

    def _dense(self, mb: Batch, b: torch.Tensor, embs: dict, seqs: dict, i: int) -> torch.Tensor:
        """Micro-batch i's dense forward and backward from its bottom MLP output `b`."""
        T, d = self.timer, self.dense
        last = i == self.plan.micro_batches - 1
        if not T.enabled and not (self._early and last):  # one backward through the whole model
            with self._compute():
                logit = d.top(d.interaction(b, embs, seqs))
            loss = F.binary_cross_entropy_with_logits(logit.float(), mb.labels, reduction="sum") / self.plan.global_batch
            loss.backward()
            return loss.detach()
        f = self._dense_forward(mb, b, embs, seqs, i)
        self._top_backward(f, i, last)
        self._interaction_backward(f, i, last)
        self._bottom_backward(f, i)
        return f.loss.detach()

    def _dense_forward(self, mb: Batch, b: torch.Tensor, embs: dict, seqs: dict, i: int) -> _DenseForward:
        """The dense forward after the bottom MLP (`b`), each stage its own autograd graph:
        each stage's backward is run (and timed) apart, and the early buckets go as soon as
        their stage is done."""
        T, d = self.timer, self.dense
        bd = b.detach().requires_grad_() if b.requires_grad else b
        with T.op("fwd", "dense", "interaction", i), self._compute():
            z = d.interaction(bd, embs, seqs)
            zd = z.detach().requires_grad_()
        with T.op("fwd", "dense", "top_mlp", i), self._compute():
            logit = d.top(zd)
        with T.op("fwd", "dense", "loss", i):
            loss = F.binary_cross_entropy_with_logits(logit.float(), mb.labels, reduction="sum") / self.plan.global_batch
        return _DenseForward(b, bd, z, zd, loss)

    def _top_backward(self, f: _DenseForward, i: int, last: bool) -> None:
        with self.timer.op("bwd", "dense", "top_mlp", i):
            f.loss.backward()
        if last:
            self._launch_buckets("top_mlp")

    def _interaction_backward(self, f: _DenseForward, i: int, last: bool) -> None:
        with self.timer.op("bwd", "dense", "interaction", i):
            backward_with(f.z, f.zd.grad)
        if last:
            self._launch_buckets("interaction")

    def _bottom_backward(self, f: _DenseForward, i: int) -> None:
        with self.timer.op("bwd", "dense", "bottom_mlp", i):
            if f.b.requires_grad:
                backward_with(f.b, f.bd.grad)

    def _layered_backward(self, lks: list[list[Lookup]], held: list) -> None:
        """Plan.backward_by_layer: every micro-batch's top MLP (its buckets go after the last),
        then per micro-batch its interaction, its packs' gradient exchange and its bottom MLP.
        Each parameter's gradient adds the micro-batches in the same order as micro-batch by
        micro-batch, so the step is the same."""
        k = len(held)
        for i, (_, f) in enumerate(held):
            self._top_backward(f, i, i == k - 1)
        for i in range(k):
            leaves, f = held[i]
            self._interaction_backward(f, i, i == k - 1)
            self._packs_backward(lks, leaves, i)
            self._bottom_backward(f, i)
            held[i] = None  # free the micro-batch's activations

    def _launch_buckets(self, stage: str) -> None:
        """All-reduce the buckets whose gradients `stage`'s backward completed (the last
        micro-batch's), asynchronously on their own process group, as DDP does."""
        for name, done_by, params in self._early:
            if done_by != stage:
                continue
            if self.comm.world == 1:  # nothing to sum: no flat copy, no copy back
                _zero_missing_grads(params)
                continue
            flat = _flat_grads(params)
            tok = self.timer.start("bwd", "dense", name, lane=BUCKET_LANE)
            work = self.comm.all_reduce(flat, async_op=True, group="bucket")
            self.timer.end_when_done(tok, work)
            self._flying.append((params, flat, work))

    def _start_grad_allreduce(self, async_op: bool):
        """All-reduce the dense gradients (those of no early bucket) followed by each pack's
        hot-row gradients, flat."""
        if self.comm.world == 1:  # nothing to sum: the gradients stay where they are (no cat, no copies back)
            _zero_missing_grads(self._synced)
            return None, Done()
        hot = [p.hot_grad.reshape(-1) for p in self.packs if p.num_hot and not p.sparse_hot]
        flat = _flat_grads(self._synced, hot)
        return flat, self.comm.all_reduce(flat, async_op, group="sync" if self.plan.buckets_grads else None)

    def _finish_dense_allreduce(self, flat: torch.Tensor | None) -> None:
        """Copy the reduced dense gradients back (they lead `flat`; the hot ones follow), and
        those of the buckets launched during the backward once they are in."""
        if flat is not None:
            _unflat_grads(self._synced, flat)
        for params, bucket, work in self._flying:
            work.wait()
            _unflat_grads(params, bucket)
        self._flying = []

    # ---- whole-model views --------------------------------------------------------------
    def full_tables(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """Every table's full weight and row state, assembled from all ranks (collective)."""
        mine = [p.shard_state() for p in self.packs]
        if self.comm.world > 1:
            import torch.distributed as dist

            everyone: list = [None] * self.comm.world
            dist.all_gather_object(everyone, mine)
        else:
            everyone = [mine]
        return tables_from_pieces(self.plan.model, [list(x) for x in zip(*everyone)])


def tables_from_pieces(model: ModelSpec, per_pack: list[list[dict]]) -> tuple[dict, dict]:
    """Per-table weights/states from each pack's pieces (one list per pack, one piece per rank):
    only the model's tables decide the assembly, not the plan that saved them."""
    weights, states = {}, {}
    for pieces in per_pack:
        first = pieces[0]
        if first["sharding"] == str(Sharding.REPLICATED):  # every rank holds the whole pack: one copy
            pieces = pieces[:1]
        rows = sum(model.table(t).num_rows for t in first["tables"])
        dim = model.table(first["tables"][0]).dim
        w, s = assemble_pieces(pieces, rows, dim)
        off = 0
        for t in first["tables"]:
            n = model.table(t).num_rows
            weights[t] = w[off : off + n]  # views: the pack's tensor is freed with its last table
            if s is not None:
                states[t] = s[off : off + n]
            off += n
    return weights, states
