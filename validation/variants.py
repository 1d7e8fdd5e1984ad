"""Plan variants of a validation sweep: the knobs a GPU run must cover beyond the planner's
recipes (planner.builders.RECIPES: packing, sharding, hot rows, micro-batches).

`PlanVariants.GPU` cycles the sweep's cases through the dense dtypes (fp32, tf32, bf16), 16-bit
tables (every other group of three) and host-placed cold rows (every fourth case), so that a
sweep of 16+ plans holds each; `NONE` leaves the cases as built.

A variant is applied only where the run and the prediction would both be of it: a dense dtype
needs a FLOP rate in the hardware spec (without one lowering costs it at fp32) and a device
that runs it (tf32 is a CUDA matmul mode; bf16 on a CPU needs its bf16 instructions, else the
executor runs fp32). A dtype left out is reported with its reason (`Variants.skipped`) and its
cases stay fp32. 16-bit tables and host-placed rows run on a CPU rank as on a GPU (the host
path stages rows in the same memory, executor.sparse.embedding).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from planner.builders import Case
from planner.errors import PlanError
from planner.modes import DenseDtype, Mode
from planner.sharding import Sharding
from simulator.hardware import HardwareSpec

DENSE_DTYPES = DenseDtype.values()  # cycled through in this order


class PlanVariants(Mode):
    """Which variants of the sweep's plans run beside them: none, or the GPU's (dense dtypes)."""

    NONE = "none"
    GPU = "gpu"


@dataclass
class Variants:
    """The sweep's cases with their variants, and the variants left out on this hardware."""

    cases: list[Case]
    skipped: dict[str, str] = field(default_factory=dict)  # variant -> why it is not run here


def dense_dtype_skips(hw: HardwareSpec, cpu_bf16: bool | None = None) -> dict[str, str]:
    """The dense dtypes beyond fp32 that `hw` cannot both run and predict, with the reason.
    `cpu_bf16`: whether the CPU has bf16 instructions (None: ask this machine's CPU)."""
    out: dict[str, str] = {}
    for dt in DENSE_DTYPES[1:]:
        if dt not in hw.gpu.flops:
            out[dt] = (f"dense {dt}: hardware {hw.name} has no {dt} FLOP rate (lowering would cost it at fp32); "
                       f"add gpu.flops.{dt} to vary it")
        elif hw.kind == "cpu" and dt == "tf32":
            out[dt] = "dense tf32: a CUDA matmul mode; a CPU rank runs it in fp32"
        elif hw.kind == "cpu" and dt == "bf16":
            if cpu_bf16 is None:
                from executor.dense.precision import cpu_has_bf16

                cpu_bf16 = cpu_has_bf16()
            if not cpu_bf16:
                out[dt] = "dense bf16: this CPU has no bf16 instructions; a CPU rank runs it in fp32"
    return out


def apply_variants(cases: list[Case], variants: PlanVariants, hw: HardwareSpec,
                   cpu_bf16: bool | None = None) -> Variants:
    """The cases with their variant applied (a case whose variant the plan refuses stays as
    built), and the variants `hw` leaves out (dense_dtype_skips)."""
    if variants == PlanVariants.NONE:
        return Variants(cases)
    skipped = dense_dtype_skips(hw, cpu_bf16)
    out = []
    for i, case in enumerate(cases):
        ddt = DENSE_DTYPES[i % len(DENSE_DTYPES)]
        if ddt in skipped:
            ddt = "fp32"
        half = (i // len(DENSE_DTYPES)) % 2 == 1
        host = i % 4 == 3
        plan = case.plan
        model = plan.model
        tables = tuple(replace(t, dtype="fp16") for t in model.tables) if half else model.tables
        model = replace(model, tables=tables, dense_dtype=ddt)
        packs = [replace(p) for p in plan.packs]
        if host:
            for p in packs:
                if Sharding(p.sharding).exchanges:
                    p.placement = "host"
        new = replace(plan, model=model, packs=packs)
        try:
            new.validate()
        except PlanError:
            out.append(case)
            continue
        tag = f"-{ddt}" + ("-t16" if half else "") + ("-host" if host else "")
        out.append(replace(case, name=case.name + tag, plan=new,
                           knobs={**case.knobs, "dense_dtype": ddt, "table_dtype": "fp16" if half else "fp32",
                                  "host": host}))
    return Variants(out, skipped)
