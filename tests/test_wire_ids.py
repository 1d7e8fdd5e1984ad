"""IDs and bag lengths travel as int32 when every packed row index of the pack fits
(Plan.wire_id_bytes): the planner costs 4 bytes per ID, and the executor sends int32."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from planner.access import table_access
from planner.plan import INT32_ROWS, PackPlan, Plan, wire_id_bytes
from planner.volumes import pack_volumes
from tests.shared_ranks import shared_call
from tests.test_executor_equivalence import mixed_case
from tests.test_executor_fused_pooled import fused_plan
from tests.test_executor_pooled import HOT, model, pooled_plan


def test_the_wire_width_follows_the_packs_rows():
    assert wire_id_bytes(INT32_ROWS - 1) == 4
    assert wire_id_bytes(INT32_ROWS) == 8


@pytest.mark.parametrize("exchange", ["rows", "pooled"])
def test_the_planner_costs_four_bytes_per_id_below_two_to_the_31_rows(exchange):
    m = model()
    plan = Plan(m, 4, 64, [PackPlan("a", ["C1", "C2", "C3"], "row_wise", exchange=exchange)])
    acc = table_access(m)
    small = pack_volumes(plan, plan.packs[0], acc, 64.0)
    # the same pack with one table past 2^31 rows: 8 bytes per ID
    big_model = replace(m, tables=[replace(t, num_rows=INT32_ROWS) if t.name == "C3" else t for t in m.tables])
    big_plan = replace(plan, model=big_model)
    big = pack_volumes(big_plan, big_plan.packs[0], table_access(big_model), 64.0)
    assert (small.id_bytes, big.id_bytes) == (4, 8)
    if exchange == "rows":
        assert small.a2a_ids_bytes.max() == pytest.approx(4 * max(small.cold_unique, small.recv_ids.max()))
    else:  # IDs and bag lengths
        send = small.cold_unique * 4 + small.owners_heard * small.bags * 4
        assert small.pooled_ids_bytes.max() >= send
        assert small.pooled_ids_bytes.max() < big.pooled_ids_bytes.max()


def _dtypes_worker(rank: int, world: int, plan_d: dict, hot: dict) -> list[str]:
    """Run two steps, recording the dtype of every integer all-to-all with split sizes (the ID
    and length exchanges; the sizes exchange has none)."""
    import torch.distributed as dist

    from executor.comm import Comm
    from executor.run.verify import local_rows, synthetic_global_batches
    from executor.step.trainer import Trainer

    seen: list[str] = []
    real = dist.all_to_all_single

    def spy(out, inp, out_splits=None, in_splits=None, *a, **kw):
        if out_splits is not None and not inp.is_floating_point():
            seen.append(str(inp.dtype))
        return real(out, inp, out_splits, in_splits, *a, **kw)

    dist.all_to_all_single = spy
    try:
        plan = Plan.from_dict(plan_d)
        batches = [local_rows(b, plan, rank) for b in synthetic_global_batches(plan, 2, seed=0)]
        tr = Trainer(plan, hot, Comm())
        for b in batches:
            tr.step(b)
        tr.comm.barrier()
    finally:
        dist.all_to_all_single = real
    return seen


SENT = {"rows": shared_call(__name__, 2, _dtypes_worker, *mixed_case(2)[:2]),
        "pooled": shared_call(__name__, 2, _dtypes_worker, pooled_plan(2, k=2, mixed=True).to_dict(), HOT),
        "fused_pooled": shared_call(__name__, 2, _dtypes_worker, fused_plan(2, 1).to_dict(), HOT)}


@pytest.mark.dist
@pytest.mark.parametrize("case", ["rows", "pooled", "fused_pooled"])
def test_the_executor_sends_ids_and_lengths_as_int32(case, shared_ranks):
    seen = shared_ranks(SENT[case])
    for got in seen:
        assert got and set(got) == {str(torch.int32)}, got
