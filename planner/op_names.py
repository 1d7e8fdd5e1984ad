"""Operator names shared by lowering (predicted) and the executor (measured).

A name is `phase/scope/op`, e.g. `fwd/pack0/a2a_ids` or `bwd/dense/allreduce`; with
several micro-batches the micro-batch index is appended as `@mb1`. A predicted op and
its measured twin share the name, which is how validation pairs them.

Conventions (lowering and executor): the `@mbK` suffix appears only when a plan has more
than one micro-batch, and never on the once-per-iteration ops (`bwd/dense/allreduce`, the
buckets `bwd/dense/allreduce_<name>` of a plan scored as TorchRec runs it, every `opt/...` op).
The gradients of replicated hot rows are data-parallel parameters: they travel in the dense
gradients' all-reduce, `bwd/dense/allreduce` (one fused buffer, as P2RES synchronises them),
so there is no per-pack all-reduce op. TorchRec's DDP all-reduces the dense gradients in
buckets launched during the backward (GRAD_BUCKET_NAMES); the data-parallel tables' gradients
travel in the last bucket, so its `bwd/dense/allreduce` is absent (but for a model without a
bottom MLP, where it carries those tables' gradients alone). Ops a pack does not
need are absent: no `hot_gather`/`hot_update` without hot rows, no `a2a_*` for replicated
packs, whose sparse-gradient all-gather is part of `opt/<pack>/cold_update`.
"""

from __future__ import annotations

from planner.modes import Exchange

PHASES = ("fwd", "bwd", "opt")

# Ops per pack, in execution order (the executor dedups a pack's IDs before routing them).
# A host-placed pack's cold rows are gathered in host memory (cold_gather), then copied over
# PCIe (cold_h2d).
PACK_FWD = ("dedup", "route", "hot_gather", "a2a_ids", "cold_gather", "cold_h2d", "a2a_emb", "pool")
PACK_BWD = ("pool", "a2a_grad")
# A pack with PackPlan.exchange "pooled" does other work under four of those names: it finds
# each ID's bag and counts bag lengths per owner instead of deduplicating (bags), the owner
# gathers and pools its part of every bag (cold_pool), pooled vectors come back (a2a_pooled)
# and pooled gradients go to the owners (a2a_pooled_grad). Its hot_gather pools the hot IDs.
POOLED_OPS = {"dedup": "bags", "cold_gather": "cold_pool", "a2a_emb": "a2a_pooled", "a2a_grad": "a2a_pooled_grad"}
PACK_FWD += ("bags", "cold_pool", "a2a_pooled")
PACK_BWD += ("a2a_pooled_grad",)
# A fused pooled group (Plan.exchange "fused_pooled", planner.pooled_twrw) reduces inside the
# node (a2a_pooled, a2a_pooled_grad) and exchanges across nodes among peers (the _x ops).
PACK_FWD += ("a2a_pooled_x",)
PACK_BWD += ("a2a_pooled_grad_x",)
# hot_sync: a pack with PackPlan.hot_sync "sparse" all-gathers its touched hot rows' gradients
# (instead of adding the whole hot set's to bwd/dense/allreduce), then hot_update applies them.
PACK_OPT = ("cold_update", "hot_sync", "hot_update")
# Ops of the dense part and the input.
# (h2d: the step's input split and gradient buffers zeroed; h2d_next: the next batch copied to
# the device during this step, on a stream of its own)
INPUT_FWD = ("h2d", "h2d_next")
DENSE_FWD = ("bottom_mlp", "interaction", "top_mlp", "loss")
# DDP's buckets of the dense gradients (TorchRec's plans): a bucket holds the parameters of
# whole stages, in backward order, and is launched when the last micro-batch's backward of its
# last stage is done. The layout follows DDP's bucket cap (planner.grad_buckets): a
# small dense model is one bucket, `allreduce_dense`; a larger one (DCNv2's 64 MB) is several,
# each but the last named after its first stage (`allreduce_top_mlp`, ...).
DENSE_STAGES_BWD = ("top_mlp", "interaction", "bottom_mlp")
LAST_BUCKET = "allreduce_dense"
GRAD_BUCKET_NAMES = (*(f"allreduce_{s}" for s in DENSE_STAGES_BWD), LAST_BUCKET)
DENSE_BWD = (*DENSE_STAGES_BWD, *GRAD_BUCKET_NAMES, "allreduce")
DENSE_OPT = ("update",)


def pack_op(op: str, exchange: str) -> str:
    """A pack op's name under the pack's exchange ("rows" or "pooled"; see POOLED_OPS)."""
    return POOLED_OPS.get(op, op) if exchange == Exchange.POOLED else op


def op_name(phase: str, scope: str, op: str, micro_batch: int | None = None) -> str:
    """`op_name("fwd", "pack0", "a2a_ids", 1)` -> `fwd/pack0/a2a_ids@mb1`."""
    if phase not in PHASES:
        raise ValueError(f"unknown phase {phase!r}")
    name = f"{phase}/{scope}/{op}"
    return name if micro_batch is None else f"{name}@mb{micro_batch}"


def split_name(name: str) -> tuple[str, str, str, int | None]:
    """Inverse of `op_name`: (phase, scope, op, micro_batch or None)."""
    base, _, mb = name.partition("@mb")
    phase, scope, op = base.split("/", 2)
    return phase, scope, op, (int(mb) if mb else None)


def base_name(name: str) -> str:
    """The name without its micro-batch suffix."""
    return name.partition("@mb")[0]


def op_class(name: str) -> str:
    """An op's class for per-class calibration: micro-batch dropped, packs alike
    (`fwd/pack3/a2a_ids@mb1` -> `fwd/pack/a2a_ids`; dense and input ops keep their scope)."""
    phase, scope, op, _ = split_name(base_name(name))
    return f"{phase}/{scope if scope in ('dense', 'input') else 'pack'}/{op}"
