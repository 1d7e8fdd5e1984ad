"""planner/modes.py: every mode a plan names, as a str enum (Sharding lives in planner.sharding).

A str enum compares equal to its plain name and prints as it, so plan files keep the plain
names and old files load unchanged. `from_str` is the one reader of a mode from text (plan
files, flags): a value outside the enum gets one line naming the valid ones.

Two questions are kept apart: what the executor runs (PlanExchange, and per pack
Exchange, Placement, HotSync) and how the planner scores a baseline that is not run as
scored (Scoring, in Provenance: TorchRec fuses what the torchrec-like baseline runs pack by pack).
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

from planner.errors import PlanError

M = TypeVar("M", bound="Mode")


class Mode(str, Enum):
    """A mode read from text by `from_str`; printed and formatted as its plain name."""

    __str__ = str.__str__
    __format__ = str.__format__

    @classmethod
    def values(cls) -> tuple[str, ...]:
        return tuple(m.value for m in cls)

    @classmethod
    def from_str(cls: type[M], value: object, what: str | None = None) -> M:
        """The member named `value`; PlanError naming `what` and the valid values otherwise."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value in cls.values():
            return cls(value)
        raise PlanError(f"{what or cls.__name__}: {value!r} is not one of {', '.join(cls.values())}")


class Exchange(Mode):
    """What crosses ranks for a pack's cold lookups (planner.exchange): "rows", the owners return
    the deduplicated rows and the requester pools; "pooled", the owners pool their part of every
    bag and return one vector per sample and table."""

    ROWS = "rows"
    POOLED = "pooled"


class Placement(Mode):
    """Where a pack's cold rows live: device memory ("hbm") or host memory, reached over PCIe."""

    HBM = "hbm"
    HOST = "host"


class HotSync(Mode):
    """How the hot rows' gradients are synchronised: "dense", the whole hot set in the dense
    all-reduce; "sparse", an all-gather of only the hot rows touched this step."""

    DENSE = "dense"
    SPARSE = "sparse"


class PlanExchange(Mode):
    """How the executor runs a plan's exchanges, and lowering scores them the same way:
    - per_pack: each pack on its own;
    - torchrec: as TorchRec runs its own plans (planner.torchrec_bridge): every lookup's ID sent,
      runs of pooled packs fused into one collective (executor.sparse.pooled_flat);
    - fused_pooled: the table-row-wise pooled packs in one hierarchical exchange (planner.pooled_twrw).
    """

    PER_PACK = "per_pack"
    TORCHREC = "torchrec"
    FUSED_POOLED = "fused_pooled"


class Scoring(Mode):
    """How a baseline is scored beside the plan it is (planner.explain), when not as it runs:
    fused_table_wise, runs of table-wise packs of one attribute group scored as one exchange, as
    TorchRec runs them (the torchrec-like baseline; the executor runs its packs one by one)."""

    FUSED_TABLE_WISE = "fused_table_wise"



class DenseDtype(Mode):
    """The precision of the dense layers (ModelSpec.dense_dtype): fp32; tf32, tensor-core matmuls
    on fp32 storage; bf16, autocast matmuls with fp32 weights, gradients and optimizer state."""

    FP32 = "fp32"
    TF32 = "tf32"
    BF16 = "bf16"

# Plan.exchange of plan files written before Scoring: "fused" was run pack by pack and scored
# fused; it loads as per_pack with Provenance.scoring fused_table_wise
LEGACY_FUSED = "fused"
