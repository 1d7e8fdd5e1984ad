"""With micro-batches the executor launches every exchange asynchronously and issues the
step stage by stage over micro-batches and packs (executor.step.trainer, `overlap`), with or
without kernel interleaving: lowering issues and chains the ops the same way."""

from planner.lowering import lower
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from simulator.hardware import load_hardware


def _plan(**kw) -> Plan:
    m = get_model("dlrm-criteo-kaggle")
    half = m.table_names[:13], m.table_names[13:]
    return Plan(model=m, world_size=8, batch_size_per_rank=2048,
                packs=[PackPlan("a", list(half[0])), PackPlan("b", list(half[1]))], **kw)


def test_micro_batches_lower_as_the_executor_overlaps():
    hw = load_hardware("dgx-h100")
    mb = lower(_plan(micro_batches=2), hw).ops
    ki = lower(_plan(micro_batches=2, kernel_interleaving=True), hw).ops
    assert [(o.name, sorted(o.deps)) for o in mb] == [(o.name, sorted(o.deps)) for o in ki]
    names = [o.name for o in mb]
    # every ID exchange is launched before any rows come back (stage by stage)
    assert max(names.index(f"fwd/{p}/a2a_ids@mb{i}") for p in "ab" for i in (0, 1)) < \
        min(names.index(f"fwd/{p}/a2a_emb@mb{i}") for p in "ab" for i in (0, 1))
    # pack b's backward does not wait for pack a's gradient exchange
    first_b = next(o for o in mb if o.name.startswith("bwd/b/") and o.name.endswith("@mb0"))
    assert "bwd/a/a2a_grad@mb0" not in first_b.deps
