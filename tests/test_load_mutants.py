"""Property test: valid model specs, plans, profiles and checkpoint manifests, mutated field
by field. Every mutant loads (and then holds only finite numbers) or is refused with one line
that names the file and, for a wrong number or type, the field. Never another exception."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from executor.comm import Comm
from executor.run import checkpoint
from executor.run.checkpoint import CheckpointError
from executor.step.trainer import Trainer
from planner.errors import PlanError
from planner.model_spec import ModelSpec, TableSpec
from planner.plan import OptimizerPlan, PackPlan, Plan
from planner.presets import load_model_file
from traces.errors import TraceError
from traces.profile import AccessProfile

BAD_VALUES = [float("nan"), float("inf"), -float("inf"), -1, 0, 0.5, -2.5, 10**18, 1e300, "7", "", None, True,
              [], {}, [1, "x"], {"a": 1}]
SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


def leaves(doc, path=()):
    """Every (path, value) below `doc`: dict keys and list indices."""
    if isinstance(doc, dict):
        items = doc.items()
    elif isinstance(doc, list):
        items = enumerate(doc)
    else:
        yield path, doc
        return
    if path:
        yield path, doc
    for k, v in items:
        yield from leaves(v, (*path, k))


def mutated(doc, path, value, delete: bool):
    doc = json.loads(json.dumps(doc))
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    if delete and isinstance(parent, dict):
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return doc


def finite_numbers(doc) -> bool:
    return all(not isinstance(v, float) or math.isfinite(v) for _, v in leaves(doc))


def check(load, doc, file: Path, errors, path, old, new, delete):
    file.write_text(json.dumps(doc))  # NaN and Infinity as JSON allows them
    try:
        out = load(file)
    except errors as exc:
        msg = str(exc)
        assert "\n" not in msg and str(file.parent) in msg, (path, new, msg)  # the file or its folder
        was_number = isinstance(old, (int, float)) and not isinstance(old, bool)
        wrong = not isinstance(new, (int, float)) or isinstance(new, bool) or not math.isfinite(new)
        if was_number and wrong and not delete and isinstance(path[-1], str):
            assert path[-1] in msg, (path, new, msg)  # the field is named
        return
    assert out is not None
    assert finite_numbers(out), (path, new)


def mutation(doc):
    paths = [p for p, _ in leaves(doc)]
    return st.tuples(st.sampled_from(paths), st.sampled_from(BAD_VALUES), st.booleans())


def small_model() -> ModelSpec:
    return ModelSpec("mut", "dlrm", 3, (TableSpec("C1", 40, 4), TableSpec("C2", 90, 4, pooling_factor=2.0)),
                     bottom_mlp=(8, 4), top_mlp=(8, 1))


def small_plan() -> Plan:
    return Plan(small_model(), 2, 8, [PackPlan("p0", ["C1"], "row_wise"), PackPlan("p1", ["C2"], "replicated")],
                hot_rows={"C2": 5}, hot_ids_file="plan.hot.npz", micro_batches=2,
                optimizer=OptimizerPlan("rowwise_adagrad", 0.1, "adam", 0.01))


SPEC_DOC = small_model().to_dict()
PLAN_DOC = small_plan().to_dict()


@SETTINGS
@given(mutation(SPEC_DOC))
def test_model_spec_mutants(tmp_path_factory, m):
    path, new, delete = m
    old = dict(leaves(SPEC_DOC))[path]
    f = tmp_path_factory.mktemp("spec") / "spec.json"
    check(lambda p: load_model_file(p).to_dict(), mutated(SPEC_DOC, path, new, delete), f, PlanError,
          path, old, new, delete)


@SETTINGS
@given(mutation(PLAN_DOC))
def test_plan_mutants(tmp_path_factory, m):
    path, new, delete = m
    old = dict(leaves(PLAN_DOC))[path]
    d = tmp_path_factory.mktemp("plan")
    np.savez(d / "plan.hot.npz", C2=np.arange(5))

    def load(p):
        plan = Plan.load(p)
        plan.load_hot_ids(p)
        return plan.to_dict()

    check(load, mutated(PLAN_DOC, path, new, delete), d / "plan.json", PlanError, path, old, new, delete)


@pytest.fixture(scope="module")
def profile_doc(tmp_path_factory) -> tuple[dict, Path]:
    from traces.profile import profile_file
    from traces.synth import generate_criteo

    d = tmp_path_factory.mktemp("prof")
    generate_criteo(d / "data.tsv", 300, seed=1)
    profile_file(str(d / "data.tsv"), "criteo", batch_size=32).save(d / "profile.json")
    return json.loads((d / "profile.json").read_text()), d


def _profile_leaves(doc):
    keep = ("rows", "source", "batch_size", "features")
    return [p for p, _ in leaves(doc) if p[0] in keep and (len(p) < 3 or p[1] == 0)]  # one feature is enough


@SETTINGS
@given(st.data())
def test_profile_mutants(profile_doc, data):
    doc, d = profile_doc
    path = data.draw(st.sampled_from(_profile_leaves(doc)))
    new, delete = data.draw(st.sampled_from(BAD_VALUES)), data.draw(st.booleans())
    old = dict(leaves(doc))[path]
    check(lambda p: AccessProfile.load(p).table(), mutated(doc, path, new, delete), d / "profile.json",
          TraceError, path, old, new, delete)


@pytest.fixture(scope="module")
def manifest_doc(tmp_path_factory) -> tuple[dict, Path, Plan]:
    plan = Plan(small_model(), 1, 8, [PackPlan("p0", ["C1", "C2"], "row_wise")])
    d = tmp_path_factory.mktemp("ck")
    checkpoint.save(Trainer(plan, {}, Comm()), d)
    return json.loads((d / "manifest.json").read_text()), d, plan


@SETTINGS
@given(st.data())
def test_manifest_mutants(manifest_doc, data):
    doc, d, plan = manifest_doc
    path = data.draw(st.sampled_from([p for p, _ in leaves(doc)]))
    new, delete = data.draw(st.sampled_from(BAD_VALUES)), data.draw(st.booleans())
    old = dict(leaves(doc))[path]
    try:
        check(lambda p: checkpoint.read_manifest(p.parent, plan), mutated(doc, path, new, delete),
              d / "manifest.json", CheckpointError, path, old, new, delete)
    finally:
        (d / "manifest.json").write_text(json.dumps(doc))
