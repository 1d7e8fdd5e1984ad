"""Buckets of the dense gradients, as DDP forms them: one owner for lowering and the executor.

DDP fills a bucket with parameters in backward order up to its cap (`bucket_cap_mb`, 25 MiB
by default, which TorchRec's DMP keeps) and all-reduces it once the backward has produced all
of them, while the rest of the backward runs. Here a bucket holds whole stages (top MLP,
interaction, bottom MLP: planner.op_names.DENSE_STAGES_BWD): a stage that would push an open
bucket past the cap starts the next one, so a bucket leaves a layer earlier than DDP's would.
A dense model under the cap is one bucket, completed by the last stage's backward.
"""

from __future__ import annotations

from planner import op_names as on
from planner.dense import DenseCost

DDP_BUCKET_CAP_MB = 25.0  # DDP's default bucket_cap_mb
MIB = 2**20


def grad_buckets(dense: DenseCost, cap_mb: float = DDP_BUCKET_CAP_MB) -> list[tuple[str, tuple[str, ...]]]:
    """(name, stages) per bucket in launch order; stages without parameters are left out, and
    so is DDP's 1 MiB first bucket. Each bucket but the last is named after its first stage
    (`allreduce_top_mlp`, ...), the last `allreduce_dense`."""
    cap = cap_mb * MIB
    layout: list[list[str]] = [[]]
    size = 0.0
    for s in on.DENSE_STAGES_BWD:
        b = float(dense.ops[s].params * 4) if s in dense.ops else 0.0
        if not b:
            continue
        if layout[-1] and size + b > cap:
            layout.append([])
            size = 0.0
        layout[-1].append(s)
        size += b
    named = [(f"allreduce_{st[0]}", tuple(st)) for st in layout[:-1]]
    return named + ([(on.LAST_BUCKET, tuple(layout[-1]))] if layout[-1] else [])


def early_buckets(dense: DenseCost, cap_mb: float) -> list[tuple[str, tuple[str, ...]]]:
    """The buckets a picasso plan with `grad_bucket_mb` launches during the backward: all but
    the last, whose stages travel in the step's one all-reduce with the hot rows' gradients
    (bwd/dense/allreduce, after the packs' backward)."""
    return grad_buckets(dense, cap_mb)[:-1] if cap_mb > 0 else []
