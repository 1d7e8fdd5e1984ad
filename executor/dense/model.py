"""The dense part of each model arch, in three stages so each can be timed on its own.

`bottom(dense) -> b`, `interaction(b, embs, seqs) -> z`, `top(z) -> logits [n]`.
`embs` maps a pooled table to [n, dim]; `seqs` maps a sequence table (pooling "none")
to (padded [n, max_len, dim], mask [n, max_len]). Every rank and the reference build
the model under the same torch seed, so replicas start identical.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from executor.dense import padding
from executor.dense.cross import cross
from executor.dense.mlp import MLP
from executor.sparse import kernels, syncfree
from planner.dense import dot_interaction_width
from planner.errors import PlanError
from planner.model_spec import ModelSpec
from planner.modes import DenseDtype


def mlp(sizes: list[int], last_act: bool) -> MLP:
    layers: list[nn.Module] = []
    for i in range(len(sizes) - 1):
        layers.append(nn.Linear(sizes[i], sizes[i + 1]))
        if i < len(sizes) - 2 or last_act:
            layers.append(nn.ReLU())
    return MLP(*layers)


class DenseArch(nn.Module):
    def __init__(self, model: ModelSpec) -> None:
        super().__init__()
        self.spec = model
        self.pooled = [t.name for t in model.tables if t.pooling != "none"]
        self.seq = [t.name for t in model.tables if t.pooling == "none"]

    def bottom(self, dense: torch.Tensor) -> torch.Tensor:
        return dense

    def gemm_inputs(self) -> dict[str, int]:
        """The Linear layers (submodule name -> logical input width) whose input the arch can lay
        out wider (executor.dense.padding); none unless the arch says."""
        return {}

    def pad_gemm_inputs(self, dtype: DenseDtype | str) -> dict[str, int]:
        """Widen the gemm_inputs layers to tensor-core alignment for `dtype` (state dicts keep
        the logical shapes); name -> width of the layers widened."""
        return padding.pad_module(self, self.gemm_inputs(), dtype)

    @staticmethod
    def fitted(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
        """`x` with zero columns up to `layer`'s input width where the layer is widened (the dense
        features need no gradient, so the pad has no backward)."""
        return F.pad(x, (0, layer.in_features - x.shape[1])) if x.shape[1] < layer.in_features else x

    def interaction(self, b: torch.Tensor, embs: dict, seqs: dict) -> torch.Tensor:
        raise NotImplementedError

    def top(self, z: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, dense: torch.Tensor, embs: dict, seqs: dict) -> torch.Tensor:
        return self.top(self.interaction(self.bottom(dense), embs, seqs))

    # the submodules of the bottom and top stages (every other parameter is the interaction's)
    BOTTOM_MODULES = ("bot", "proj")
    TOP_MODULES = ("topm", "deep")

    def stage_parameters(self) -> dict[str, list[nn.Parameter]]:
        """The parameters each stage's backward completes, by stage name (planner.op_names
        DENSE_STAGES_BWD), in registration order."""
        out: dict[str, list[nn.Parameter]] = {"top_mlp": [], "interaction": [], "bottom_mlp": []}
        for name, q in self.named_parameters():
            head = name.split(".", 1)[0]
            stage = ("bottom_mlp" if head in self.BOTTOM_MODULES else "top_mlp" if head in self.TOP_MODULES
                     else "interaction")
            out[stage].append(q)
        return out

    def flat_embs(self, embs: dict, seqs: dict) -> torch.Tensor:
        """Pooled tables in model order, sequences mean-pooled over their valid items."""
        parts = [embs[t] for t in self.pooled]
        for t in self.seq:
            x, m = seqs[t]
            parts.append((x * m.unsqueeze(-1)).sum(1) / m.sum(1, keepdim=True).clamp(min=1))
        return torch.cat(parts, dim=1)


class DLRM(DenseArch):
    """Bottom MLP, pairwise dot products of [bottom, embeddings...], top MLP (Naumov et al.)."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__(model)
        dims = {t.dim for t in model.tables}
        if len(dims) != 1 or self.seq:
            raise PlanError(f"model {model.name}: dlrm needs pooled tables of one dim, got dims {sorted(dims)}")
        d = dims.pop()
        if model.bottom_mlp and model.bottom_mlp[-1] != d:
            raise PlanError(f"model {model.name}: bottom_mlp must end in the table dim {d}")
        self.bot = mlp([model.num_dense, *model.bottom_mlp], last_act=True) if model.bottom_mlp else None
        self.proj = None if model.bottom_mlp else nn.Linear(model.num_dense, d)
        self.topm = mlp([dot_interaction_width(model), *(model.top_mlp or (1,))], last_act=False)

    def gemm_inputs(self) -> dict[str, int]:
        return {"bot.0" if self.bot is not None else "proj": self.spec.num_dense, "topm.0": dot_interaction_width(self.spec)}

    def bottom(self, dense):
        if self.bot is None:
            return self.proj(self.fitted(dense, self.proj))
        return self.bot(self.fitted(dense, self.bot[0]))

    def interaction(self, b, embs, seqs):
        xs = [b] + [embs[n] for n in self.pooled]
        width = self.topm[0].in_features  # the pairs, then zero columns where the top MLP is widened
        dots = syncfree.triton_interaction(b)  # CUDA (or forced): the fused kernels, output in the compute dtype
        if dots is not None:
            return dots.dot_interaction(xs, width=width)
        z = kernels.dot_interaction(xs)
        return F.pad(z, (0, width - z.shape[1])) if z.shape[1] < width else z

    def top(self, z):
        return self.topm(z).squeeze(1)


class DeepFM(DenseArch):
    """FM second-order term over the field embeddings + linear dense term + deep MLP."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__(model)
        dims = {t.dim for t in model.tables}
        if len(dims) != 1:
            raise PlanError(f"model {model.name}: deepfm needs tables of one dim, got {sorted(dims)}")
        d = dims.pop()
        self.width = d * len(model.tables) + model.num_dense
        self.linear = nn.Linear(model.num_dense, 1) if model.num_dense else None
        self.deep = mlp([self.width, *(model.top_mlp or (1,))], last_act=False)

    def interaction(self, b, embs, seqs):
        fields = [embs[t] for t in self.pooled]
        for t in self.seq:
            x, m = seqs[t]
            fields.append((x * m.unsqueeze(-1)).sum(1))
        v = torch.stack(fields, dim=1)
        fm = 0.5 * (v.sum(1).pow(2) - v.pow(2).sum(1)).sum(1, keepdim=True)
        if self.linear is not None:
            fm = fm + self.linear(b)
        return torch.cat([v.flatten(1), b, fm], dim=1)

    def top(self, z):
        return self.deep(z[:, :-1]).squeeze(1) + z[:, -1]


class DCN(DenseArch):
    """DCN-v2: cross layers x_{l+1} = x0 * (W x_l + b) + x_l, then a deep MLP. With
    extra["cross_rank"] r, W = U V is low-rank (V: width -> r, U: r -> width, bias on U), as
    MLPerf's DLRM-DCNv2; with a bottom MLP, x0 starts with its output instead of the raw
    dense features."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__(model)
        self.bot = mlp([model.num_dense, *model.bottom_mlp], last_act=True) if model.bottom_mlp else None
        width = (model.bottom_mlp[-1] if model.bottom_mlp else model.num_dense) + sum(t.dim for t in model.tables)
        layers, rank = model.cross_layers, model.cross_rank
        if rank:
            self.cross = nn.ModuleList(nn.Sequential(nn.Linear(width, rank, bias=False), nn.Linear(rank, width))
                                       for _ in range(layers))
        else:
            self.cross = nn.ModuleList(nn.Linear(width, width) for _ in range(layers))
        self.deep = mlp([width, *(model.top_mlp or (1,))], last_act=False)

    def gemm_inputs(self) -> dict[str, int]:
        return {"bot.0": self.spec.num_dense} if self.bot is not None else {}

    def bottom(self, dense):
        return self.bot(self.fitted(dense, self.bot[0])) if self.bot is not None else dense

    def interaction(self, b, embs, seqs):
        x0 = torch.cat([b, self.flat_embs(embs, seqs)], dim=1)
        x = x0
        for layer in self.cross:
            x = cross(x0, x, layer)  # x0 * layer(x) + x, fused where the MLPs are
        return x

    def top(self, z):
        return self.deep(z).squeeze(1)


class WideDeep(DenseArch):
    """Wide part: sum of the 1-wide tables + a linear term on dense; deep part: MLP."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__(model)
        self.wide_tables = model.wide_tables
        self.deep_tables = [t for t in self.pooled if t not in self.wide_tables]
        width = model.num_dense + sum(model.table(t).dim for t in self.deep_tables)
        self.linear = nn.Linear(model.num_dense, 1) if model.num_dense else None
        self.deep = mlp([width, *(model.top_mlp or (1,))], last_act=False)

    def interaction(self, b, embs, seqs):
        wide = sum(embs[t].sum(1, keepdim=True) for t in self.wide_tables) if self.wide_tables else 0
        if self.linear is not None:
            wide = wide + self.linear(b)
        if isinstance(wide, int):
            wide = torch.zeros(b.shape[0], 1, device=b.device)
        deep_in = torch.cat([b] + [embs[t] for t in self.deep_tables], dim=1)
        return torch.cat([deep_in, wide], dim=1)

    def top(self, z):
        return self.deep(z[:, :-1]).squeeze(1) + z[:, -1]


class DIN(DenseArch):
    """Attention of each behaviour sequence against its query item (Zhou et al., 2018)."""

    def __init__(self, model: ModelSpec) -> None:
        super().__init__(model)
        query = dict(model.extra.get("query", {}))
        for s in self.seq:
            if s not in query:
                same = [t for t in self.pooled if model.table(t).dim == model.table(s).dim]
                if not same:
                    raise PlanError(f"model {model.name}: sequence table {s} has no query table of its dim")
                query[s] = same[0]
        self.query = query
        hidden = model.attention_mlp
        self.att = nn.ModuleDict({
            s: mlp([4 * model.table(s).dim, *hidden, 1], last_act=False) for s in self.seq
        })
        width = model.num_dense + sum(t.dim for t in model.tables)
        self.deep = mlp([width, *(model.top_mlp or (1,))], last_act=False)

    def interaction(self, b, embs, seqs):
        parts = [b] + [embs[t] for t in self.pooled]
        for s in self.seq:
            x, m = seqs[s]
            q = embs[self.query[s]].unsqueeze(1).expand_as(x)
            w = self.att[s](torch.cat([q, x, q - x, q * x], dim=-1)).squeeze(-1) * m
            parts.append((w.unsqueeze(-1) * x).sum(1))  # DIN keeps raw (unnormalised) weights
        return torch.cat(parts, dim=1)

    def top(self, z):
        return self.deep(z).squeeze(1)


ARCH_CLASSES = {"dlrm": DLRM, "deepfm": DeepFM, "dcn": DCN, "wide_deep": WideDeep, "din": DIN}


def build_dense(model: ModelSpec, seed: int) -> DenseArch:
    """The dense model of an arch, initialised from `seed` (identical on every rank)."""
    if model.arch not in ARCH_CLASSES:
        raise PlanError(f"model {model.name}: arch {model.arch!r} has no executor implementation")
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return ARCH_CLASSES[model.arch](model)
    finally:
        torch.random.set_rng_state(state)
