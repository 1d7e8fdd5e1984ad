"""Plan variants of a validation sweep: the knobs a GPU run must cover beyond the planner's
recipes (planner.builders.RECIPES: packing, sharding, hot rows, micro-batches).

`PlanVariants.GPU` cycles the sweep's cases through the dense dtypes (fp32, tf32, bf16), 16-bit
tables (every other group of three) and host-placed cold rows (every fourth case), so that a
sweep of 16+ plans holds each; `NONE` leaves the cases as built.
"""

from __future__ import annotations

from dataclasses import replace
from enum import Enum

from planner.builders import Case
from planner.errors import PlanError
from planner.sharding import Sharding

DENSE_DTYPES = ("fp32", "tf32", "bf16")


class PlanVariants(str, Enum):
    NONE = "none"
    GPU = "gpu"

    @classmethod
    def from_str(cls, text: str) -> PlanVariants:
        try:
            return cls(str(text).lower())
        except ValueError:
            raise ValueError(f"--variants {text!r}: expected one of {', '.join(v.value for v in cls)}") from None


def apply_variants(cases: list[Case], variants: PlanVariants) -> list[Case]:
    """The cases with their variant applied (a case whose variant the plan refuses stays as built)."""
    if variants == PlanVariants.NONE:
        return cases
    out = []
    for i, case in enumerate(cases):
        ddt = DENSE_DTYPES[i % len(DENSE_DTYPES)]
        half = (i // len(DENSE_DTYPES)) % 2 == 1
        host = i % 4 == 3
        plan = case.plan
        model = plan.model
        tables = tuple(replace(t, dtype="fp16") for t in model.tables) if half else model.tables
        model = replace(model, tables=tables, extra={**model.extra, "dense_dtype": ddt})
        packs = [replace(p) for p in plan.packs]
        if host:
            for p in packs:
                if Sharding(p.sharding) != Sharding.REPLICATED:
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
    return out
