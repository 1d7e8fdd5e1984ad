"""Every exchange family implements executor.sparse.protocol.PackExchange, the one interface the
trainer drives a pack through: same members, the same parameters (the trainer passes them by
position), and packs built as the trainer builds them carry every attribute the protocol names."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from executor.comm import Comm
from executor.sparse.embedding import ShardedPack
from executor.sparse.pooled import PooledPack
from executor.sparse.pooled_twrw import FusedPooledPack
from executor.sparse.protocol import PackExchange
from executor.step.trainer import Trainer
from planner.plan import PackPlan, Plan
from tests.test_executor_features import model

FAMILIES = (ShardedPack, PooledPack, FusedPooledPack)


def protocol_members() -> tuple[list[str], list[str]]:
    """(methods and properties, data attributes) the protocol names."""
    calls = [n for n, v in vars(PackExchange).items() if not n.startswith("_") and (callable(v) or isinstance(v, property))]
    data = [n for n in PackExchange.__annotations__]
    return calls, data


def shape(fn) -> list[tuple]:
    """Each parameter's kind and whether it has a default (the trainer passes them by position)."""
    return [(p.kind, p.default is inspect.Parameter.empty) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("family", FAMILIES, ids=lambda c: c.__name__)
def test_each_family_has_the_protocols_methods_with_its_parameters(family):
    calls, _ = protocol_members()
    assert len(calls) > 20
    for n in calls:
        want, got = getattr(PackExchange, n), getattr(family, n, None)
        assert got is not None, f"{family.__name__} lacks {n}"
        if isinstance(want, property):
            assert isinstance(got, property), f"{family.__name__}.{n} is not a property"
            continue
        assert shape(got) == shape(want), (family.__name__, n, inspect.signature(got), inspect.signature(want))


def test_packs_carry_every_attribute_the_protocol_names():
    packs = [PackPlan("r", ["C1", "C2"], "row_wise"), PackPlan("p", ["C3", "C5"], "row_wise", exchange="pooled"),
             PackPlan("c", ["C4"], "replicated")]
    plan = Plan(model(), 1, 8, packs, hot_rows={"C2": 5}, hot_ids_file="hot.npz")
    hot = {"C2": np.arange(5)}
    tr = Trainer(plan, hot, Comm())
    built = [*tr.packs, PooledPack(plan, packs[1], hot, Comm())]
    _, data = protocol_members()
    for p in built:
        missing = [n for n in data if not hasattr(p, n)]
        assert not missing, (p.name, missing)
    # the trainer names only the protocol, never a family
    src = inspect.getsource(Trainer)
    assert "ShardedPack" not in src and "PooledPack" not in src
