"""The ops of a rank's program before they become simulator nodes: planner.lowering builds
them, and so does planner.exchange for pooled packs (kept apart so neither imports the other)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

POOL_STAGE = 6
LANES = ("copy", "compute", "comm")


@dataclass
class Op:
    """One op of the per-rank program before it becomes OpGraph nodes."""

    name: str
    lane: str
    kind: str  # "compute" | "copy" | "collective"
    demand: dict[str, Any]  # flops, hbm_bytes, host_bytes, pcie_bytes: scalar or per-rank array
    deps: list[str] = field(default_factory=list)
    collective: tuple[str, Any] | None = None  # (type, bytes per rank: scalar or array)
    group: str | None = None  # None: every rank; "node": the rank's node; "peers": same local index
    algorithm: str | None = None  # collective algorithm (None: the simulator's default)
    ranks: np.ndarray | None = None  # ranks that run it; None: every rank
    args: dict[str, Any] = field(default_factory=dict)
    dtype: str = "fp32"  # picks the hardware's FLOP rate (dense ops: the model's dense_dtype)


def compute(name: str, deps: list[str], *, flops: Any = 0.0, hbm: Any = 0.0, host: Any = 0.0,
             pcie: Any = 0.0, ranks: np.ndarray | None = None, **args: Any) -> Op:
    return Op(name, "compute", "compute",
              {"flops": flops, "hbm_bytes": hbm, "host_bytes": host, "pcie_bytes": pcie},
              list(deps), ranks=ranks, args=args)  # its own list: lowering appends to an op's deps


def collective(name: str, deps: list[str], ctype: str, nbytes: Any, group: str | None = None,
                algorithm: str | None = None, **args: Any) -> Op:
    return Op(name, "comm", "collective", {}, list(deps), collective=(ctype, nbytes), group=group, algorithm=algorithm,
              args=args)
