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
    gradient accumulations, so the order of the two can be checked."""

    def __init__(self, log: list) -> None:
        super().__init__()
        self.log = log

    def all_reduce(self, t: torch.Tensor, async_op: bool = False):
        self.log.append(("all_reduce", t.numel()))
        return Done()


@pytest.mark.parametrize("timed", [False, True], ids=["untimed", "op-timing"])
@pytest.mark.parametrize("k", [1, 2])
def test_top_mlp_bucket_is_launched_before_the_bottom_mlp_backward(timed, k):
    model = dlrm_model()
    plan = Plan(model=model, world_size=1, batch_size_per_rank=16, micro_batches=k,
                packs=[PackPlan("pack0", model.table_names)])
    log: list = []
    trainer = Trainer(plan, {}, RecordingComm(log), OpTimer(0, torch.device("cpu"), enabled=timed, micro_batches=k))
    d = trainer.dense  # DLRM: its top MLP and bottom MLP, named directly (no bucket code involved)
    stages = {"top_mlp": list(d.topm.parameters()), "bottom_mlp": list(d.bot.parameters()), "interaction": []}
    for stage in ("top_mlp", "bottom_mlp"):
        for p in stages[stage]:
            p.register_post_accumulate_grad_hook(lambda _p, s=stage: log.append(("grad", s)))
    trainer.step(synthetic_global_batches(plan, 1, seed=3)[0])
    n = {s: sum(p.numel() for p in ps) for s, ps in stages.items()}
    launches = [i for i, e in enumerate(log) if e[0] == "all_reduce"]
    # two buckets: the top MLP's, then the rest of the dense model's (no hot rows: no third)
    assert [log[i][1] for i in launches] == [n["top_mlp"], n["interaction"] + n["bottom_mlp"]]
    last_bottom = [i for i, e in enumerate(log) if e == ("grad", "bottom_mlp")][-len(stages["bottom_mlp"]):]
    last_top = [i for i, e in enumerate(log) if e == ("grad", "top_mlp")][-len(stages["top_mlp"]):]
    # the top bucket goes once its last gradient is in (this test's hook on that parameter runs
    # after the trainer's, hence the +1), before the bottom MLP's backward starts
    assert max(last_top) <= launches[0] + 1 and launches[0] < min(last_bottom)
    assert max(last_bottom) <= launches[1] + 1 and launches[1] > min(last_bottom)
    # only the last micro-batch launches: earlier ones' gradients are not final
    assert all(e != ("all_reduce", n["top_mlp"]) for e in log[: min(last_top)])


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
