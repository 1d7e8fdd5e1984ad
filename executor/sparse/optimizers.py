"""Which sparse optimizers the executor trains which tables with.

Tables may ask for SGD, row-wise Adagrad, Adagrad or Adam (planner.model_spec); the planner
costs all four. SGD and row-wise Adagrad run everywhere, fused into the backward by the Triton
kernels where they can be. Adagrad and Adam update through torch (executor.sparse.row_optimizers)
on fp32 tables that are not split by columns (their 16-bit update with stochastic rounding and
the column-wise split of their per-element state are not written); a plan that asks for them
there is refused before any rank starts.
"""

from __future__ import annotations

from executor.sparse.row_optimizers import TORCH_ONLY
from planner.errors import PlanError
from planner.plan import Plan, table_optimizer


def check_trainable(plan: Plan) -> None:
    """PlanError (one line) naming the first table whose optimizer the executor cannot run as planned."""
    for pack in plan.packs:
        for name in pack.tables:
            t = plan.model.table(name)
            opt = table_optimizer(plan, t)
            if opt not in TORCH_ONLY:
                continue
            if t.dtype != "fp32":
                raise PlanError(f"table {t.name}: optimizer {opt} on a {t.dtype} table is planned and simulated, "
                                "but the executor updates 16-bit tables with sgd or rowwise_adagrad only")
            if plan.geometry(pack).splits_columns and plan.world_size > 1:
                raise PlanError(f"table {t.name}: optimizer {opt} in column_wise pack {pack.name} is planned and "
                                "simulated, but the executor splits only row-wise Adagrad's state by columns; "
                                "shard it another way to run it")
