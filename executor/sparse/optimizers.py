"""Which sparse optimizers the executor trains tables with.

Tables may ask for SGD, row-wise Adagrad, Adagrad or Adam (planner.model_spec); the planner
costs all four. The executor's update paths (Triton kernels fused into the backward, the C++
and torch row updates, the hot caches, low-precision storage, checkpoints and the --verify
reference) keep one fp32 accumulator per row at most, so it trains SGD and row-wise Adagrad
tables; a plan with another is refused before any rank starts.
"""

from __future__ import annotations

from planner.errors import PlanError
from planner.model_spec import FUSED_OPTIMIZERS
from planner.plan import Plan, table_optimizer


def check_trainable(plan: Plan) -> None:
    """PlanError (one line) naming the first table whose optimizer the executor does not run."""
    for t in plan.model.tables:
        opt = table_optimizer(plan, t)
        if opt not in FUSED_OPTIMIZERS:
            raise PlanError(f"table {t.name}: optimizer {opt} is planned and simulated, but the executor trains "
                            f"tables with {' or '.join(FUSED_OPTIMIZERS)} only; set the table's optimizer to one "
                            "of those to run it")
