"""`--cuda-graph` (executor.run.cuda_graph): the flag's way from `picasso run` to the worker, the
plans it refuses with one line, the static-buffer checks, and on a GPU that a captured run
trains the same weights as an uncaptured one."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from executor.comm import Comm
from executor.data.batches import Batch
from executor.run.config import GraphMode, RunConfig
from executor.run.cuda_graph import GraphStep, _copy_into, _same_shapes, _static_copy, graph_stepper, refusal
from executor.run.reference import dense_state
from executor.run.verify import synthetic_global_batches
from executor.step.trainer import Trainer
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan

CUDA = torch.device("cuda")


def plan(world: int = 1, **pack) -> Plan:
    tables = (TableSpec("C1", 40, 8), TableSpec("C2", 300, 8), TableSpec("C3", 25, 8))
    m = ModelSpec("g", "dlrm", 4, tables, bottom_mlp=(16, 8), top_mlp=(16, 1))
    return Plan(m, world, 16, [PackPlan("p0", ["C1", "C2", "C3"], "row_wise", **pack)], hot_rows={"C2": 6},
                hot_ids_file="hot.npz", optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adagrad", 0.05), seed=3)


def test_a_one_rank_device_plan_is_capturable():
    assert refusal(plan(), CUDA) is None


@pytest.mark.parametrize("change,why", [
    (lambda p: p, "runs on cpu"),
    (lambda p: replace(p, world_size=2), "2 ranks"),
    (lambda p: replace(p, packs=[replace(p.packs[0], placement="host")]), "pack p0 is placed in host memory"),
    (lambda p: replace(p, optimizer=OptimizerPlan("sgd", 0.1, "adam", 0.01)), "adam"),
    (lambda p: replace(p, model=replace(p.model, tables=(replace(p.model.tables[0], dtype="fp16"),
                                                         *p.model.tables[1:]))), "table C1 is fp16"),
])
def test_plans_whose_step_changes_are_refused_with_the_reason(change, why):
    p = change(plan())
    dev = torch.device("cpu") if why == "runs on cpu" else CUDA
    assert why in refusal(p, dev)
    assert "per-op timing" in refusal(plan(), CUDA, op_timing=True)


def test_a_refused_or_unwanted_graph_leaves_the_trainer_as_it_is():
    p = plan()
    tr = Trainer(p, {"C2": np.arange(6)}, Comm())
    said: list[str] = []
    assert graph_stepper(tr, GraphMode.OFF, False, said.append) is tr and said == []
    assert graph_stepper(tr, GraphMode.AUTO, False, said.append) is tr and said == []  # silently, by default
    assert graph_stepper(tr, GraphMode.ON, False, said.append) is tr
    assert said == ["cuda graph: not used: the step runs on cpu, not a CUDA GPU; the run continues without it"]


def test_static_buffers_take_batches_of_the_same_shapes_only():
    p = plan()
    a, b = synthetic_global_batches(p, 2, seed=1)
    static = _static_copy(a, pad=False)
    assert _same_shapes(static, b)  # one-hot bags: every batch has the captured shapes
    _copy_into(static, b)
    assert torch.equal(static.dense, b.dense) and all(
        torch.equal(static.sparse[t][0], b.sparse[t][0]) for t in b.sparse)
    assert static.dense.data_ptr() != b.dense.data_ptr()  # the buffers stay the graph's
    rows, off = b.sparse["C1"]
    longer = Batch(b.labels, b.dense, {**b.sparse, "C1": (torch.cat([rows, rows[:1]]), torch.cat(
        [off[:-1], off[-1:] + 1]))})
    assert not _same_shapes(static, longer)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the step runs on CUDA: nothing to refuse")
def test_the_flag_reaches_the_worker_which_says_why_it_is_not_used(tmp_path, capsys):
    from executor.run.worker import main

    p = plan()
    p.save(tmp_path / "plan.json")
    np.savez(tmp_path / "hot.npz", C2=np.arange(6))
    RunConfig(plan=str(tmp_path / "plan.json"), data="synthetic", steps=3, cuda_graph=GraphMode.ON,
              result=str(tmp_path / "result.json")).save(tmp_path / "config.json")
    rc = main([str(tmp_path / "config.json")])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert err.count("cuda graph: not used: the step runs on cpu") == 1
    # and the run's result says it too (a worker's stderr is only shown when the run fails)
    import json

    note = json.loads((tmp_path / "result.json").read_text())["cuda_graph_note"]
    assert note.startswith("cuda graph: not used: the step runs on cpu"), note


def test_picasso_run_passes_the_flag_on(monkeypatch, tmp_path):
    from picasso.cli import main

    seen: dict = {}

    def launch(config, **kw):
        seen["config"] = config
        raise SystemExit(0)

    monkeypatch.setattr("executor.process.launch.launch", launch)
    p = plan()
    p.save(tmp_path / "plan.json")
    np.savez(tmp_path / "hot.npz", C2=np.arange(6))
    with pytest.raises(SystemExit):
        main(["run", str(tmp_path / "plan.json"), "--data", "synthetic", "--steps", "2", "--cuda-graph"])
    assert seen["config"].cuda_graph == "on"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_captured_run_trains_the_weights_of_an_uncaptured_one():
    """Eight steps (three warm-up, one capture, four replays) against eight eager steps."""
    p = plan()
    batches = synthetic_global_batches(p, 8, seed=7)
    eager = Trainer(p, {"C2": np.arange(6)}, Comm(CUDA))
    losses_eager = [float(eager.step(b.to(CUDA))) for b in batches]
    captured = Trainer(p, {"C2": np.arange(6)}, Comm(CUDA))
    said: list[str] = []
    stepper = graph_stepper(captured, True, False, said.append)
    assert isinstance(stepper, GraphStep)
    losses = [float(stepper.step(b.to(CUDA))) for b in batches]
    assert said == [] and stepper.graph is not None, said
    assert captured.steps_done == eager.steps_done == 8
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(losses_eager), rtol=1e-5, atol=1e-6)
    we, se = eager.full_tables()
    wc, sc = captured.full_tables()
    for name in we:
        torch.testing.assert_close(wc[name], we[name], rtol=1e-5, atol=1e-6)
    de, dc = dense_state(eager.dense), dense_state(captured.dense)
    for name in de:
        torch.testing.assert_close(dc[name], de[name], rtol=1e-5, atol=1e-6)


def test_the_note_counts_replayed_and_uncaptured_steps():
    """A run whose bags change length from batch to batch (missing categorical values) runs
    uncaptured; the result says how many steps the graph served, and why not the others."""
    from executor.run.cuda_graph import graph_note

    g = GraphStep.__new__(GraphStep)  # the counters only: no CUDA stream on this machine
    g.seen, g.uncaptured, g.replayed, g.eager_why, g._warned_shapes, g.static = 5, 25, 1, None, True, object()
    g.pads = True
    note = graph_note(g, GraphMode.AUTO, None)
    assert note.startswith("cuda graph: 1 of 30 steps replayed the captured graph; 25 ran uncaptured"), note
    assert graph_note(g, GraphMode.OFF, None) is None
    assert graph_note(object(), GraphMode.ON, "2 ranks: ...") == "cuda graph: not used: 2 ranks: ..."
    assert graph_note(object(), GraphMode.AUTO, "2 ranks: ...") is None  # not asked for: nothing to say


def _with_missing(b: Batch, table: str, drop: list[int]) -> Batch:
    """`b` with the bags `drop` of `table` emptied (missing categorical values)."""
    rows, off = b.sparse[table]
    lens = (off[1:] - off[:-1]).clone()
    lens[drop] = 0
    keep = torch.repeat_interleave(lens > 0, off[1:] - off[:-1])
    new_off = torch.cat([off[:1], torch.cumsum(lens, 0)])
    return Batch(b.labels, b.dense, {**b.sparse, table: (rows[keep], new_off)})


def test_padded_buffers_train_as_the_batches_themselves():
    """Bags that change length from batch to batch (missing values) fit one padded buffer per
    table: the padding forms an extra bag per table that the model never reads, so training on
    the buffers gives the weights of training on the batches (the graph's step, on the CPU)."""
    p = replace(plan(), hot_rows={}, hot_ids_file=None)
    batches = synthetic_global_batches(p, 4, seed=2)
    batches = [_with_missing(b, "C1", [1, 5 + i]) for i, b in enumerate(batches)]
    batches[2] = _with_missing(batches[2], "C3", [0, 2, 3])
    plain, padded = Trainer(p, {}, Comm()), Trainer(p, {}, Comm())
    static = _static_copy(batches[0], pad=True)
    assert static.pad_bags and len(static.sparse["C1"][0]) == len(batches[0])  # one ID a bag at most
    for b in batches:
        assert _same_shapes(static, b)
        _copy_into(static, b)
        la, lb = plain.step(b), padded.step(static)
        assert torch.allclose(la, lb, rtol=1e-6, atol=1e-7)
    for pa, pb in zip(plain.packs, padded.packs):
        torch.testing.assert_close(pb.weight, pa.weight, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(pb.state, pa.state, rtol=1e-6, atol=1e-7)
    for x, y in zip(plain.dense.parameters(), padded.dense.parameters()):
        torch.testing.assert_close(y, x, rtol=1e-6, atol=1e-7)


def test_padded_lookups_name_their_padding_bags(monkeypatch):
    """The pools of a padded step are told which bags are padding (one a table, after its
    batch's bags) so that the Triton pool skips them; a plain step's are told none."""
    from executor.sparse import syncfree

    seen: list[int] = []
    real = syncfree.bag_forward
    monkeypatch.setattr(syncfree, "bag_forward",
                        lambda w, i, o, mode, pad_every=0: seen.append(pad_every) or real(w, i, o, mode, pad_every))
    p = replace(plan(), hot_rows={}, hot_ids_file=None)
    b = synthetic_global_batches(p, 1, seed=2)[0]
    Trainer(p, {}, Comm()).step(_static_copy(b, pad=True))
    assert seen and set(seen) == {len(b) + 1}
    seen.clear()
    Trainer(p, {}, Comm()).step(b)
    assert seen and set(seen) == {0}


def test_a_graphs_eager_steps_and_capture_are_untimed():
    """With a graph the first WARMUP steps run eagerly and the next is the capture (tens of ms):
    none of them is a steady step, so the default untimed steps cover them; --warmup rules."""
    from executor.run.cuda_graph import WARMUP, untimed_steps

    g = object.__new__(GraphStep)  # no CUDA stream needed for the rule
    assert untimed_steps(15, None, g) == WARMUP + 1
    assert untimed_steps(15, None, object()) == 3  # a quarter, 1 to 3, without a graph
    assert untimed_steps(3, None, g) == 2  # a timed step is left
    assert untimed_steps(1, None, g) == 0
    assert untimed_steps(15, 0, g) == 0
