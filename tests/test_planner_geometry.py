"""planner.geometry: the one owner of which rows and columns each shard holds and who owns a row."""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

import numpy as np
import pytest

from planner.geometry import KINDS, shard_geometry
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from planner.sharding import Sharding

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("sharding", list(Sharding))
@pytest.mark.parametrize("rows,dim,ranks", [(10, 4, (3, 1, 2)), (7, 5, (0, 2)), (2, 3, (1, 0, 2))])
def test_every_row_and_column_is_held_as_the_sharding_says(sharding, rows, dim, ranks):
    g = shard_geometry(sharding, rows, dim, ranks, world=4)
    cover = np.zeros((rows, dim), dtype=int)
    for s in g.shards:
        c0, c1 = s.col_range
        cover[s.packed_rows(), c0:c1] += 1
        # a shard is its sizes and offsets: the slice and the row list agree
        assert np.array_equal(np.arange(rows)[s.row_slice], s.packed_rows())
    holders = 4 if sharding == Sharding.REPLICATED else 1
    assert (cover == holders).all()  # each cell once, or on every rank of the world for a replica


@pytest.mark.parametrize("sharding", [Sharding.ROW_WISE, Sharding.TABLE_ROW_WISE])
def test_row_wise_is_cyclic_and_owner_local_and_packed_row_agree(sharding):
    g = shard_geometry(sharding, 11, 4, (5, 2, 7), world=8)
    assert [list(s.packed_rows()) for s in g.shards] == [[0, 3, 6, 9], [1, 4, 7, 10], [2, 5, 8]]
    rows = np.arange(11)
    owner, local = g.owner(rows), g.local_row(rows)
    assert list(owner) == [r % 3 for r in rows]
    for r in rows:
        assert g.shards[owner[r]].packed_rows()[local[r]] == r
        assert g.packed_row(local[r], owner[r]) == r
    assert g.index(2) == 1 and g.index(3) == -1 and g.on_rank(3) is None


def test_column_wise_splits_the_dim_as_array_split_and_every_shard_holds_every_row():
    g = shard_geometry(Sharding.COLUMN_WISE, 6, 10, (0, 1, 2, 3), world=4)
    parts = np.array_split(np.arange(10), 4)
    assert g.col_slices() == [(int(p[0]), int(p[-1]) + 1) for p in parts]
    assert all(s.rows == 6 for s in g.shards) and g.id_fanout == 4 and g.row_owners == 1


def test_table_wise_and_replicated():
    tw = shard_geometry(Sharding.TABLE_WISE, 9, 4, (2,), world=4)
    assert [(s.rank, s.rows, s.cols) for s in tw.shards] == [(2, 9, 4)]
    rep = shard_geometry(Sharding.REPLICATED, 9, 4, (1,), world=3)
    assert rep.ranks == (0, 1, 2) and not rep.is_partitioned and not rep.owns_whole_rows


def test_the_plan_hands_out_its_packs_geometry_and_checks_their_fit():
    m = get_model("dlrm-criteo-kaggle")
    names = m.table_names
    plan = Plan(m, 4, 64, [PackPlan("a", names[:5], Sharding.TABLE_ROW_WISE, [2, 3]),
                           PackPlan("b", names[5:], Sharding.REPLICATED)])
    a = plan.geometry(plan.packs[0])
    assert a.ranks == (2, 3) and a.rows == plan.pack_rows(plan.packs[0]) and a.within_node
    assert a.layout_name == Sharding.ROW_WISE  # its rows lie as row-wise ones do
    assert plan.geometry(plan.packs[1]).ranks == (0, 1, 2, 3)
    assert set(KINDS) == set(Sharding)


def test_the_readers_of_the_geometry_do_not_branch_on_the_sharding():
    """The planner's volumes and memory, lowering, and the executor's sparse wing ask the
    geometry; none of them names a Sharding member."""
    files = [ROOT / "planner" / n for n in ("volumes.py", "memory.py", "lowering.py")]
    files += sorted((ROOT / "executor" / "sparse").glob("*.py"))
    found = []
    for f in files:
        toks = list(tokenize.generate_tokens(io.StringIO(f.read_text()).readline))
        for a, b in zip(toks, toks[1:]):
            if a.string == "Sharding" and b.string == ".":
                found.append(f"{f.relative_to(ROOT)}:{a.start[0]}")
    assert not found, found
