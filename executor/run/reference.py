"""The plain single-process reference: nn.EmbeddingBag per table + the same dense model.

Same initial weights (executor.sparse.layout), same global batches, mean BCE over the global
batch, the same optimizers (kernels.sparse_update_ref for embeddings, torch.optim for
dense). Any plan must end at the same weights up to floating-point rounding.

A 16-bit table is stored in its dtype here too: each step pools an fp32 copy of it and
updates the stored rows by the executor's stochastic rounding (executor.sparse.lowp), so the
reference has the same precision as the plan it checks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from executor.data.batches import Batch
from executor.dense.model import build_dense
from executor.sparse import kernels, lowp, row_optimizers
from executor.sparse.layout import init_table_rows
from executor.step.trainer import make_dense_optimizer, pad_sequences
from planner.model_spec import ModelSpec, TableSpec, optimizer_state_bytes
from planner.plan import Plan, table_optimizer

# the reference's autograd and sparse-update workspace and its block-wise comparison
# (measured: about 200 MiB over its tables on the full-size Criteo model)
REFERENCE_WORKSPACE = 256 << 20


class RecModel(nn.Module):
    """The whole model in plain PyTorch: one nn.EmbeddingBag per table under `embedding_bags`
    (the names of TorchRec's EmbeddingBagCollection) and the dense model under `dense`.

    `rows(table)` gives a table's starting weight (fp32); without it the tables start
    uninitialised, for a model whose weights are loaded next (executor.run.model_file)."""

    def __init__(self, model: ModelSpec, seed: int = 0,
                 rows: Callable[[TableSpec], torch.Tensor] | None = None) -> None:
        super().__init__()
        self.spec = model
        self.embedding_bags = nn.ModuleDict()
        for t in model.tables:
            mode = "sum" if t.pooling == "none" else t.pooling
            # the initial rows become the weight itself: no second full-size copy
            self.embedding_bags[t.name] = nn.EmbeddingBag(
                t.num_rows, t.dim, mode=mode, sparse=True, include_last_offset=True,
                _weight=rows(t) if rows is not None else torch.empty(t.num_rows, t.dim))
        self.dense = build_dense(model, seed)

    def forward(self, batch: Batch) -> torch.Tensor:
        """One logit per sample of `batch` (its rows already mapped to table rows)."""
        return self.dense(batch.dense, *self.pooled(batch))

    def pooled(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """The dense model's embedding inputs: pooled bags, and padded sequences for pooling "none"."""
        embs, seqs = {}, {}
        for t in self.spec.tables:
            rows, off = batch.sparse[t.name]
            bag = self.embedding_bags[t.name]
            if t.pooling == "none":
                per_id = bag(rows, torch.arange(len(rows) + 1))
                seqs[t.name] = pad_sequences(per_id, off, t.max_len)
            else:
                embs[t.name] = bag(rows, off)
        return embs, seqs


class Reference:
    def __init__(self, plan: Plan) -> None:
        self.plan = plan
        model = plan.model
        self.net = RecModel(model, plan.seed, lambda t: init_table_rows(model, t.name, plan.seed))
        self.bags = self.net.embedding_bags
        self.states: dict[str, torch.Tensor] = {}
        self.opt_of = {}
        self.low: dict[str, torch.Tensor] = {}  # 16-bit tables: their stored rows
        self.row_base = lowp.model_row_offsets(model)
        self.steps = 0
        for t in model.tables:
            dtype = lowp.storage_dtype(t.dtype)
            if lowp.is_low(dtype):
                self.low[t.name] = self.bags[t.name].weight.detach().to(dtype)
            self.opt_of[t.name] = table_optimizer(plan, t)
            state = row_optimizers.new_state(self.opt_of[t.name], t.num_rows, t.dim)
            if state is not None:
                self.states[t.name] = state
        self.dense = self.net.dense
        self.opt = make_dense_optimizer(plan, self.dense.parameters())
        # after load_state: the start value of each row the reference has updated since
        self._origin: dict[str, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
        self._seen: dict[str, torch.Tensor] = {}

    def step(self, batch: Batch) -> float:
        with torch.no_grad():
            for name, stored in self.low.items():  # pooled in fp32 from the 16-bit rows
                self.bags[name].weight.copy_(stored.float())
        logit = self.net(batch)
        loss = F.binary_cross_entropy_with_logits(logit, batch.labels, reduction="mean")
        self.opt.zero_grad(set_to_none=False)
        for bag in self.bags.values():
            bag.weight.grad = None
        loss.backward()
        o = self.plan.optimizer
        with torch.no_grad():
            for name, bag in self.bags.items():
                if bag.weight.grad is None:
                    continue
                g = bag.weight.grad.coalesce()
                self._remember(name, g.indices()[0])
                if name in self.low:
                    rows = g.indices()[0]
                    lowp.update_rows(self.low[name], self.states.get(name), rows, g.values(),
                                     rows + self.row_base[name], self.opt_of[name], o.sparse_lr, o.eps,
                                     self.steps, self.plan.seed)
                    continue
                kernels.sparse_update_ref(
                    bag.weight.data, self.states.get(name), g.indices()[0], g.values(), self.opt_of[name],
                    o.sparse_lr, o.eps, self.steps,
                )
        self.opt.step()
        self.steps += 1
        return float(loss.detach())

    def load_state(self, tables: Iterable[tuple[str, torch.Tensor, torch.Tensor | None]],
                   dense: dict, optimizer: dict) -> None:
        """Start where a resumed run starts: `tables` yields (table, weight, row state) one table
        at a time (checkpoint.saved_tables), so no second full copy of the model is held.

        From then on the reference keeps the start value of each row it updates, which is all
        `moved_from_start` needs.
        """
        loaded = set()
        with torch.no_grad():
            for name, w, st in tables:
                self.bags[name].weight.copy_(w)
                if name in self.low:  # a 16-bit table's storage is the authoritative copy
                    self.low[name] = w.to(self.low[name].dtype)
                if name in self.states and st is not None:
                    self.states[name] = st.clone()
                loaded.add(name)
        if loaded != set(self.bags):
            raise ValueError(f"the reference's start state lacks table {sorted(set(self.bags) - loaded)[0]!r}")
        self.dense.load_state_dict(dense)
        self.opt.load_state_dict(optimizer)
        self._origin = {name: [] for name in self.bags}
        self._seen = {}

    def _remember(self, name: str, rows: torch.Tensor) -> None:
        """Keep the start value of rows updated for the first time since load_state."""
        if self._origin is None:
            return
        seen = self._seen.get(name)
        if seen is None:
            seen = self._seen[name] = torch.zeros(len(self.bags[name].weight), dtype=torch.bool)
        new = rows[~seen[rows]]
        if len(new):
            seen[new] = True
            self._origin[name].append((new, self.weight(name)[new].float().clone()))

    def tables(self) -> dict[str, torch.Tensor]:
        return {n: self.low[n].clone() if n in self.low else b.weight.detach().clone() for n, b in self.bags.items()}

    def weight(self, table: str) -> torch.Tensor:
        """A table's current weight (a view, not a copy): its 16-bit storage where it has one."""
        return self.low[table] if table in self.low else self.bags[table].weight.detach()

    def moved_from_start(self) -> float:
        """Largest relative change (max|start - now| / max|now|) of any table since its start:
        the initialisation, whose rows are regenerated block by block rather than kept (they
        would double the reference), or the state given to load_state."""
        if self._origin is not None:
            return self._moved_since_load()
        from executor.sparse.collect import BLOCK_ROWS

        worst = 0.0
        for name in self.bags:
            w = self.weight(name)
            diff = scale = 0.0
            for lo in range(0, len(w), BLOCK_ROWS):
                block = w[lo : lo + BLOCK_ROWS]
                start = init_table_rows(self.plan.model, name, self.plan.seed, np.arange(lo, lo + len(block)))
                diff = max(diff, float((start - block.float()).abs().max()))
                scale = max(scale, float(block.float().abs().max()))
            worst = max(worst, diff / scale if scale > 0 else diff)
        return worst

    def _moved_since_load(self) -> float:
        worst = 0.0
        for name, kept in self._origin.items():
            if not kept:
                continue
            w = self.weight(name)
            rows = torch.cat([r for r, _ in kept])
            start = torch.cat([v for _, v in kept])
            diff = float((w[rows].float() - start).abs().max())
            scale = float(w.float().abs().max())
            worst = max(worst, diff / scale if scale > 0 else diff)
        return worst


def reference_bytes(plan: Plan, steps: int, resumed: bool = False) -> int:
    """What --verify adds on rank 0: the reference's full tables and row states, its dense
    model, the kept global batches, and the largest pack collected from the ranks; after a
    resume also the largest saved pack it reads to start from (checkpoint.saved_tables: a
    replica read once, a sharded pack as its pieces plus the pack they are assembled into)."""
    model = plan.model
    tables = sum(t.num_rows * (t.dim * 4 + optimizer_state_bytes(table_optimizer(plan, t), t.dim))
                 for t in model.tables)
    dense = sum(p.numel() for p in build_dense(model, plan.seed).parameters()) * 4 * 4
    row = 4 + 4 * model.num_dense + 8 * len(model.tables)
    kept = steps * plan.global_batch * row * 2  # parsed rows and their batch tensors
    pack = 0  # a sharded pack is assembled whole next to one received shard; a replica is read in place
    for p in plan.packs:
        full = plan.pack_rows(p) * model.table(p.tables[0]).dim * 4
        if p.sharding.exchanges:
            pack = max(pack, full + full // max(1, len(plan.pack_ranks(p))))
        elif plan_has_hot(plan, p):
            pack = max(pack, full)  # the replica is copied before its hot rows are written over it
    start = 0
    if resumed:
        for p in plan.packs:
            full = plan.pack_rows(p) * model.table(p.tables[0]).dim * 4
            start = max(start, 2 * full if p.sharding.exchanges else full)
    return int(tables + dense + kept + max(pack, start) + REFERENCE_WORKSPACE)


def plan_has_hot(plan: Plan, pack) -> bool:
    return any(plan.hot_rows.get(t, 0) for t in pack.tables)


def max_rel_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """Largest over groups of max|a - b| / max|b| (b is the reference).

    A group is one embedding table, or one dense layer (its weight and bias together:
    a layer's bias alone can be a single number near zero, whose relative error says
    nothing about the layer).
    """
    groups: dict[str, list[str]] = {}
    for k in b:
        if k not in a:
            raise KeyError(f"{k} is missing from the compared weights")
        groups.setdefault(k.rsplit(".", 1)[0] if k.startswith("dense.") else k, []).append(k)
    worst = 0.0
    for keys in groups.values():
        scale = max((float(b[k].abs().max()) for k in keys if b[k].numel()), default=0.0)
        diff = max((float((a[k].float() - b[k].float()).abs().max()) for k in keys if b[k].numel()), default=0.0)
        worst = max(worst, diff / scale if scale > 0 else diff)
    return worst


def dense_state(module: nn.Module) -> dict[str, torch.Tensor]:
    return {f"dense.{k}": v.detach().cpu().clone() for k, v in module.state_dict().items()}
