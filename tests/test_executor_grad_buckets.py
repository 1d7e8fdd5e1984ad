"""The dense gradients' all-reduce runs in buckets launched during the last backward (DDP's overlap)."""

from __future__ import annotations

import pytest
import torch

from executor.comm import Comm, Done
from executor.dense import build_dense
from executor.timing import OpTimer
from executor.trainer import Trainer
from executor.verify import synthetic_global_batches
from planner import op_names as on
from planner.plan import PackPlan, Plan
from tests.test_executor_equivalence import dlrm_model, other_models


@pytest.mark.parametrize("model", [dlrm_model(), *other_models()], ids=lambda m: m.name)
def test_every_parameter_belongs_to_exactly_one_stage(model):
    dense = build_dense(model, 0)
    stages = dense.stage_params()
    assert sorted(id(p) for ps in stages.values() for p in ps) == sorted(id(p) for p in dense.parameters())
    assert stages["top_mlp"]  # every arch has a top MLP: the first bucket is never empty


def test_a_stage_map_that_misses_a_parameter_is_refused():
    dense = build_dense(dlrm_model(), 0)
    dense.STAGES = {"top_mlp": ("topm",)}  # the bottom MLP's parameters would never be all-reduced
    with pytest.raises(RuntimeError, match="exactly once"):
        dense.stage_params()


class RecordingComm(Comm):
    """One process; every all-reduce launch is logged (with how big it is) next to the backward's
    gradient accumulations and the packs' backward, so their order can be checked."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def all_reduce(self, t: torch.Tensor, async_op: bool = False, group=None):
        self.log.append(("all_reduce", t.numel()))
        return Done()


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "op-timing"])
@pytest.mark.parametrize("k", [1, 2])
def test_dense_bucket_is_launched_before_the_packs_backward(timed, k):
    model = dlrm_model()
    plan = Plan(model=model, world_size=1, batch_size_per_rank=16, micro_batches=k,
                packs=[PackPlan("pack0", model.table_names)])
    log: list = []
    trainer = Trainer(plan, {}, RecordingComm(log), OpTimer(0, torch.device("cpu"), enabled=timed, micro_batches=k))
    d = trainer.dense  # DLRM: its bottom MLP, named directly (no bucket code involved)
    bottom = list(d.bot.parameters())
    for p in bottom:
        p.register_post_accumulate_grad_hook(lambda _p: log.append(("grad", "bottom_mlp")))
    pack = trainer.packs[0]
    pack_backward = pack.backward

    def logged_backward(*a, **kw):
        log.append(("pack_backward",))
        return pack_backward(*a, **kw)

    pack.backward = logged_backward
    trainer.step(synthetic_global_batches(plan, 1, seed=3)[0])
    launches = [i for i, e in enumerate(log) if e[0] == "all_reduce"]
    n_dense = sum(p.numel() for p in d.parameters())
    assert [log[i][1] for i in launches] == [n_dense]  # one bucket, every dense gradient (no hot rows)
    last_bottom = [i for i, e in enumerate(log) if e == ("grad", "bottom_mlp")][-len(bottom):]
    last_pack = [i for i, e in enumerate(log) if e == ("pack_backward",)][-1]
    # launched once the last micro-batch's dense gradients are in (this test's hook on the last
    # parameter runs after the trainer's, hence the +1), before that micro-batch's pack backward
    assert max(last_bottom) <= launches[0] + 1 and launches[0] < last_pack
    assert len([e for e in log if e == ("pack_backward",)]) == k


def test_each_layout_of_buckets_launches_in_order_as_its_stages_finish(monkeypatch):
    monkeypatch.setattr("executor.grad_buckets.GRAD_BUCKETS",
                        (("allreduce_top_mlp", ("top_mlp",)), ("allreduce_interaction", ("interaction", "bottom_mlp"))))
    model = dlrm_model()
    plan = Plan(model=model, world_size=1, batch_size_per_rank=16, packs=[PackPlan("pack0", model.table_names)])
    log: list = []
    trainer = Trainer(plan, {}, RecordingComm(log))
    d = trainer.dense
    for p in d.bot.parameters():
        p.register_post_accumulate_grad_hook(lambda _p: log.append(("grad", "bottom_mlp")))
    trainer.step(synthetic_global_batches(plan, 1, seed=3)[0])
    launches = [i for i, e in enumerate(log) if e[0] == "all_reduce"]
    top = sum(p.numel() for p in d.topm.parameters())
    assert [log[i][1] for i in launches] == [top, sum(p.numel() for p in d.parameters()) - top]
    first_bottom = min(i for i, e in enumerate(log) if e == ("grad", "bottom_mlp"))
    assert launches[0] < first_bottom < launches[1]  # the top MLP's bucket flies during the bottom's backward


def test_reduced_gradients_are_the_ones_the_update_reads():
    """The buckets' buffers are the parameters' .grad: no copy back can be forgotten."""
    model = dlrm_model()
    plan = Plan(model=model, world_size=1, batch_size_per_rank=16, packs=[PackPlan("pack0", model.table_names)])
    trainer = Trainer(plan, {}, Comm())
    trainer.step(synthetic_global_batches(plan, 1, seed=3)[0])
    for b in trainer.grads.buckets:
        for p in b.params:
            assert p.grad.untyped_storage().data_ptr() == b.flat.untyped_storage().data_ptr()
    assert {b.name for b in trainer.grads.buckets} <= {name for name, _ in on.GRAD_BUCKETS}
