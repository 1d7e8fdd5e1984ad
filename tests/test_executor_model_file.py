"""The trained model out: a sharded 2-rank run's checkpoint becomes one safetensors file that a
plain-PyTorch model loads in one process and scores exactly as the run evaluated itself."""

from __future__ import annotations

import contextlib
import io
import json
import struct
from dataclasses import replace

import numpy as np
import pytest
import torch

import picasso
from executor.run import safetensors_io as st
from executor.run.model_file import ModelFileError, load
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model


def sharded_plan() -> Plan:
    """Row-wise with hot rows, column-wise in host memory, and 16-bit tables, on 2 ranks."""
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(400), bottom_mlp=(16, 16), top_mlp=(16, 1))
    m = replace(m, tables=tuple(replace(t, dtype="fp16") if i >= 20 else t for i, t in enumerate(m.tables)))
    n = m.table_names
    packs = [PackPlan("rows", n[:10], "row_wise"), PackPlan("cols", n[10:20], "column_wise", placement="host"),
             PackPlan("half", n[20:], "row_wise")]
    return Plan(m, 2, 32, packs, hot_rows={"C1": 20, "C2": 8}, hot_ids_file="hot.npz", micro_batches=2, seed=5)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("model_out")
    generate_criteo(d / "train.tsv", 1024, seed=0)
    generate_criteo(d / "test.tsv", 300, seed=1)
    sharded_plan().save(d / "plan.json", hot_ids={"C1": np.arange(20) * 7, "C2": np.arange(8)})
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = main(["run", str(d / "plan.json"), "--data", str(d / "train.tsv"), "--steps", "6", "--eval-data",
                   str(d / "test.tsv"), "--eval-batch", "100", "--checkpoint", str(d / "ck"), "--json"])
    assert rc == 0
    return d, json.loads(out.getvalue())["eval"][-1]


@pytest.mark.dist
def test_exported_model_scores_as_the_run_evaluated(trained, capsys):
    d, run_eval = trained
    model = d / "model.safetensors"
    assert main(["export-model", str(d / "ck"), "-o", str(model), "--json"]) == 0
    wrote = json.loads(capsys.readouterr().out)
    assert wrote["tables"] == 26 and wrote["steps"] == 6 and wrote["last_eval"]["auc"] == run_eval["auc"]
    assert main(["score", str(model), "--data", str(d / "test.tsv"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["rows"] == run_eval["rows"] == 300
    assert abs(got["auc"] - run_eval["auc"]) <= 1e-6
    assert abs(got["logloss"] - run_eval["logloss"]) <= 1e-6
    assert picasso.score(model, d / "test.tsv")["logloss"] == pytest.approx(got["logloss"], abs=1e-12)


@pytest.mark.dist
def test_model_file_is_a_plain_state_dict_with_torchrec_names(trained):
    d, _ = trained
    model = d / "plain.safetensors"
    picasso.export_model(d / "ck", model)
    tensors, meta = st.read(model)
    plan = sharded_plan()
    assert {k for k in tensors if k.startswith("embedding_bags.")} == \
        {f"embedding_bags.{t}.weight" for t in plan.model.table_names}
    assert tensors["embedding_bags.C21.weight"].dtype == torch.float16  # a 16-bit table stays 16-bit
    assert tensors["embedding_bags.C1.weight"].shape == (plan.model.table("C1").num_rows, plan.model.table("C1").dim)
    tables = json.loads(meta["tables"])
    assert tables["C5"]["feature"] == "C5" and tables["C21"]["dtype"] == "fp16"
    # a plain EmbeddingBag per table, strict loading, from the file alone
    bags = torch.nn.ModuleDict({t.name: torch.nn.EmbeddingBag(t.num_rows, t.dim, mode="sum")
                                for t in plan.model.tables})
    holder = torch.nn.Module()
    holder.embedding_bags = bags
    holder.load_state_dict({k: v.float() for k, v in tensors.items() if k.startswith("embedding_bags.")})
    net = picasso.load_model(model)
    assert isinstance(net, torch.nn.Module) and not net.training
    assert torch.equal(net.embedding_bags["C21"].weight, tensors["embedding_bags.C21.weight"].float())
    # training changed the tables: the export holds trained rows, not the initialisation
    from executor.run.reference import Reference

    start = Reference(plan).net.state_dict()
    assert not torch.equal(start["embedding_bags.C1.weight"], net.state_dict()["embedding_bags.C1.weight"])


def test_file_layout_is_safetensors(tmp_path):
    """By the format's definition: u64 header length, JSON header, tensors back to back after it."""
    f = tmp_path / "t.safetensors"
    tensors = {"a": torch.arange(6, dtype=torch.float32).reshape(2, 3), "b": torch.tensor([1.5, -2], dtype=torch.bfloat16),
               "e": torch.zeros(0, 4), "c": torch.arange(3, dtype=torch.int64)}
    entries = st.layout({k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()})
    st.write(f, entries, {"k": "v"}, lambda: iter(reversed(list(tensors.items()))))
    raw = f.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    head = json.loads(raw[8:8 + n])
    assert head.pop("__metadata__") == {"k": "v"}
    assert head["b"]["dtype"] == "BF16" and head["a"]["shape"] == [2, 3]
    spans = sorted(tuple(h["data_offsets"]) for h in head.values())
    assert spans[0][0] == 0 and all(x[1] == y[0] for x, y in zip(spans, spans[1:])) and spans[-1][1] == len(raw) - 8 - n
    a0, a1 = head["a"]["data_offsets"]
    assert np.frombuffer(raw[8 + n + a0:8 + n + a1], dtype="<f4").tolist() == [0, 1, 2, 3, 4, 5]
    back, meta = st.read(f)
    assert meta == {"k": "v"} and all(torch.equal(back[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("damage", ["short", "length", "json", "offsets"])
def test_damaged_files_are_refused_in_one_line(tmp_path, damage, capsys):
    f = tmp_path / "m.safetensors"
    st.write(f, st.layout({"a": (torch.float32, (4,))}), {}, lambda: iter([("a", torch.ones(4))]))
    raw = bytearray(f.read_bytes())
    if damage == "short":
        raw = raw[:5]
    elif damage == "length":
        raw[:8] = struct.pack("<Q", 1 << 40)
    elif damage == "json":
        raw[9] = ord("#")
    else:
        raw = raw[:-4]  # the tensor's bytes run past the end
    f.write_bytes(bytes(raw))
    with pytest.raises(st.SafetensorsError, match="m.safetensors"):
        st.read(f)
    assert main(["score", str(f), "--data", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "m.safetensors" in err


def test_a_foreign_safetensors_file_is_not_a_model(tmp_path, capsys):
    f = tmp_path / "other.safetensors"
    st.write(f, st.layout({"w": (torch.float32, (2, 2))}), {"format": "pt"}, lambda: iter([("w", torch.eye(2))]))
    with pytest.raises(ModelFileError, match="not a picasso model file"):
        load(f)
    assert main(["export-model", str(tmp_path / "nothing"), "-o", str(tmp_path / "x.safetensors")]) == 2
    assert "no such checkpoint" in capsys.readouterr().err
    assert not (tmp_path / "x.safetensors").exists()


@pytest.mark.dist
def test_a_checkpoint_without_its_model_spec_needs_the_plan(trained, tmp_path, capsys):
    import shutil

    d, _ = trained
    old = tmp_path / "old"
    shutil.copytree(d / "ck", old)
    doc = json.loads((old / "manifest.json").read_text())
    del doc["model_spec"]  # as manifests were written before they carried it
    (old / "manifest.json").write_text(json.dumps(doc))
    assert main(["export-model", str(old), "-o", str(tmp_path / "m.safetensors")]) == 2
    assert "give the plan it was trained with" in capsys.readouterr().err
    assert main(["export-model", str(old), "--plan", str(d / "plan.json"), "-o", str(tmp_path / "m.safetensors")]) == 0
    picasso.export_model(d / "ck", tmp_path / "new.safetensors")
    a, b = st.read(tmp_path / "m.safetensors")[0], st.read(tmp_path / "new.safetensors")[0]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    other = replace(sharded_plan(), model=replace(sharded_plan().model, bottom_mlp=(8, 16)))
    other.save(tmp_path / "other.json", hot_ids={"C1": np.arange(20), "C2": np.arange(8)})
    assert main(["export-model", str(old), "--plan", str(tmp_path / "other.json"), "-o", str(tmp_path / "x")]) == 2
    assert "does not match" in capsys.readouterr().err


def test_a_model_file_must_hold_its_specs_weights(tmp_path):
    from executor.run.model_file import metadata
    from executor.run.reference import RecModel
    from planner.model_spec import ModelSpec, TableSpec

    spec = ModelSpec("tiny", "dlrm", 2, (TableSpec("C1", 5, 4), TableSpec("C2", 3, 4)), bottom_mlp=(4,),
                     top_mlp=(4, 1))
    weights = {k: v.detach().clone() for k, v in RecModel(spec, rows=lambda t: torch.ones(t.num_rows, t.dim))
               .state_dict().items()}
    meta = metadata(spec, {"steps": 0, "world_size": 1})

    def write(tensors: dict, name: str):
        f = tmp_path / name
        st.write(f, st.layout({k: (v.dtype, tuple(v.shape)) for k, v in tensors.items()}), meta,
                 lambda: iter(tensors.items()))
        return f

    net = load(write(weights, "whole.safetensors"))
    assert torch.equal(net.embedding_bags["C2"].weight, torch.ones(3, 4))
    short = {k: v for k, v in weights.items() if k != "embedding_bags.C2.weight"}
    with pytest.raises(ModelFileError, match="'embedding_bags.C2.weight' is missing"):
        load(write(short, "short.safetensors"))
    with pytest.raises(ModelFileError, match="'extra' is not one of the model's"):
        load(write({**weights, "extra": torch.zeros(1)}, "extra.safetensors"))
