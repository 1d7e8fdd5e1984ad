"""The bottom MLP runs while the step's rows are in flight.

It reads the dense features only, yet it used to wait for its micro-batch's pooled
embeddings, so the compute stream idled during the first micro-batch's exchange (about 4%
of DLRM Criteo Kaggle's step on 4 x 8 H100 with one 400 Gb/s NIC per node). The executor now
runs every micro-batch's bottom MLP once the step's exchanges are launched, and lowering
issues it there; TorchRec's plans keep TorchRec's order (DLRM.forward runs the dense arch
before the sparse arch's lookups). The weights trained stay the reference's: the
equivalence tests cover every plan kind; one case is run here through the trainer's
one-graph path and through its stage-by-stage path (gradient buckets).
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.equivalence_cases import assert_shared_cases_match, shared_cases
from tests.shared_ranks import shared_call
from tests.test_executor_equivalence import TOL
from tests.test_executor_grad_buckets import TINY, _lowered, dcn_plan
from tests.test_layered_backward import DCN_HOT as HOT
from tests.test_layered_backward import _issued_worker

BOTTOM = "fwd/dense/bottom_mlp"
ISSUED = shared_call(__name__, 2, _issued_worker, dcn_plan(2, k=4).to_dict())


@pytest.mark.dist
def test_the_executor_runs_every_bottom_mlp_before_the_first_pooling(shared_ranks):
    plan = dcn_plan(2, k=4)
    issued = shared_ranks(ISSUED)[0]
    computed = [n for n, lane in issued if lane == "compute" and n.startswith("fwd/")]
    first_pool = min(i for i, n in enumerate(computed) if n.split("/")[2].startswith("pool"))
    assert [n for n in computed[:first_pool] if n.startswith(BOTTOM)] == [f"{BOTTOM}@mb{i}" for i in range(4)]
    # lowering issues the dense forward and the poolings in the same order
    ops, _ = _lowered(plan)
    dense = [n for n in computed if "/dense/" in n or "/pool@" in n]
    assert dense == [n for n in ops if n in set(dense)]


def test_lowering_frees_the_bottom_mlp_from_the_exchange():
    ops, _ = _lowered(dcn_plan(2, k=2))
    names = list(ops)
    for mb in (0, 1):
        assert ops[f"{BOTTOM}@mb{mb}"].deps == ["fwd/input/h2d"]
        assert f"{BOTTOM}@mb{mb}" in ops[f"fwd/dense/interaction@mb{mb}"].deps
        assert names.index(f"{BOTTOM}@mb{mb}") < names.index("fwd/b/pool@mb0")


def test_torchrec_plans_keep_torchrecs_order():
    ops, _ = _lowered(replace(dcn_plan(2, k=1), exchange="torchrec", hot_rows={}, hot_ids_file=None))
    names = list(ops)
    first_pack = min(i for i, n in enumerate(names) if n.split("/")[1] in ("a", "b") and n.startswith("fwd/"))
    assert names.index(BOTTOM) < first_pack


def test_memory_holds_every_micro_batchs_bottom_activations():
    from planner.access import table_access
    from planner.dense import dense_cost
    from planner.lowering import analyze
    from simulator.hardware import load_hardware

    plan = dcn_plan(2, k=4)
    hw = load_hardware("local-cpu", ["gpus_per_node=2"])
    acts = {k: analyze(replace(plan, micro_batches=k), hw, table_access(plan.model))[1].hbm["activations"][0]
            for k in (1, 4)}
    d = dense_cost(plan.model)
    rest = d.act_bytes - d.ops["bottom_mlp"].act_bytes
    # four micro-batches hold a quarter of the other activations, and all of the bottom MLP's
    assert acts[1] - acts[4] == pytest.approx(plan.batch_size_per_rank * rest * 2 * 3 / 4)


BASE = dcn_plan(2, k=4).to_dict()
SHARED = shared_cases(__name__, 2, [(BASE, HOT, 5, 2), ({**BASE, "grad_bucket_mb": TINY}, HOT, 6, 2)])


@pytest.mark.dist
def test_training_matches_the_reference_on_both_dense_paths(shared_ranks):
    assert_shared_cases_match(shared_ranks, SHARED, TOL,
                              lambda d: (d["model"]["name"], d["micro_batches"], d["grad_bucket_mb"]))
