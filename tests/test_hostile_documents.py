"""Every document picasso reads may come from someone else (model and hardware specs, plans, profiles,
dataset and checkpoint manifests, run results, timelines): generated hostile versions of each are
refused in one line naming the file (foundation.documents), and the encodings Windows tools write
read as the same document (foundation.text)."""

from __future__ import annotations

import codecs
import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.presets import get_model

HOSTILE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MODEL = get_model("dlrm-criteo-kaggle").with_row_cap(100)
ENCODINGS = {  # what Notepad, PowerShell and other Windows tools write: each with its byte-order mark
    "utf-8-sig": lambda t: t.encode("utf-8-sig"),
    "utf-16-le": lambda t: codecs.BOM_UTF16_LE + t.encode("utf-16-le"),
    "utf-16-be": lambda t: codecs.BOM_UTF16_BE + t.encode("utf-16-be"),
    "utf-32-le": lambda t: codecs.BOM_UTF32_LE + t.encode("utf-32-le"),
    "utf-32-be": lambda t: codecs.BOM_UTF32_BE + t.encode("utf-32-be"),
}


@dataclass
class Kind:
    """One kind of document: its file name, how to write a valid one (text), how to load it (a
    comparable value), and for YAML a mapping whose content the loader keeps as it is."""

    file: str
    text: Callable[[Path], str]
    load: Callable[[Path], object]
    free: str | None = None  # YAML: the key of a free-form mapping


def _model_yaml(d: Path) -> str:
    from planner.model_spec import spec_yaml

    return spec_yaml(MODEL)


def _hardware_yaml(d: Path) -> str:
    from simulator.hardware import load_hardware

    hw = load_hardware("local-cpu").to_dict()
    hw.pop("source", None)
    return yaml.safe_dump(hw, sort_keys=False) + "source: {}\n"


def _hardware_json(d: Path) -> str:
    from simulator.hardware import load_hardware

    return json.dumps(load_hardware("local-cpu").to_dict())


def _plan(d: Path) -> str:
    from planner.plan import PackPlan, Plan

    Plan(MODEL, 1, 8, [PackPlan("p0", MODEL.table_names, "row_wise")]).save(d / "doc.json")
    return (d / "doc.json").read_text()


def _profile(d: Path) -> str:
    from traces.profile import AccessProfile, FeatureProfile

    f = FeatureProfile("C1", rows=10, missing=0, distinct=3, accesses=10, ids=np.array([5, 6, 7]),
                       counts=np.array([5, 3, 2]))
    AccessProfile({"C1": f}, rows=10, source="t").save(d / "doc.json")
    return (d / "doc.json").read_text()


def _checkpoint_manifest(d: Path) -> str:
    files = {}
    for name in ("rank0.pt", "dense.pt"):
        (d / name).write_bytes(name.encode())
        files[name] = {"bytes": len(name), "sha256": hashlib.sha256(name.encode()).hexdigest()}
    return json.dumps({"format": "picasso-checkpoint-1", "model": "m", "model_fingerprint": "f", "world_size": 1,
                       "steps": 0, "data_position": 0, "files": files})


def _run_result(d: Path) -> str:
    from tests.test_run_result import a_result

    return a_result().to_json()


def _timeline(d: Path) -> str:
    from simulator.timeline import Timeline

    tl = Timeline()
    tl.add(0, "compute", "fwd/dense", 0.0, 5.0, step=1)
    return json.dumps(tl.to_dict())


def _load_model(p: Path):
    return get_model(str(p)).to_dict()


def _load_hardware(p: Path):
    from simulator.hardware import load_hardware

    return load_hardware(str(p)).to_dict()


def _load_plan(p: Path):
    from planner.plan import Plan

    return Plan.load(p).to_dict()


def _load_profile(p: Path):
    from traces.profile import AccessProfile

    return AccessProfile.load(p).table()


def _load_checkpoint_manifest(p: Path):
    from executor.run.checkpoint import read_manifest

    p.replace(p.with_name("manifest.json"))
    return {k: v for k, v in read_manifest(p.parent).items() if k != "_files_dir"}


def _load_run_result(p: Path):
    from executor.run.result import RunResult

    return RunResult.load(p).to_dict()


def _load_timeline(p: Path):
    from simulator.measured import load_timeline

    return load_timeline(p).to_dict()


KINDS = {
    "model yaml": Kind("spec.yaml", _model_yaml, _load_model, free="extra"),
    "model json": Kind("spec.json", lambda d: json.dumps(MODEL.to_dict()), _load_model),
    "hardware yaml": Kind("hw.yaml", _hardware_yaml, _load_hardware, free="source"),
    "hardware json": Kind("hw.json", _hardware_json, _load_hardware),
    "plan": Kind("doc.json", _plan, _load_plan),
    "profile": Kind("doc.json", _profile, _load_profile),
    "checkpoint manifest": Kind("doc.json", _checkpoint_manifest, _load_checkpoint_manifest),
    "run result": Kind("result.json", _run_result, _load_run_result),
    "timeline": Kind("trace.json", _timeline, _load_timeline),
}
YAML_KINDS = sorted(k for k, v in KINDS.items() if v.free)


def _write(tmp_path_factory, kind: str, content: str | bytes | Callable[[str], str | bytes]) -> Path:
    """A folder holding a valid document of `kind` (and what it refers to), its text replaced by
    `content` (or content(valid text)); the path of the document."""
    d = tmp_path_factory.mktemp("doc")
    k = KINDS[kind]
    valid = k.text(d)
    data = content(valid) if callable(content) else content
    path = d / k.file
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _refused(kind: str, path: Path, *words: str) -> str:
    """The loader's refusal: a ValueError of one line naming the file (and `words`)."""
    with pytest.raises(ValueError) as e:
        KINDS[kind].load(path)
    msg = str(e.value)
    assert "\n" not in msg and str(path.parent) in msg and all(w in msg for w in words), msg
    return msg


def _with_free(text: str, key: str, entries: dict[str, str]) -> str:
    """A YAML document with `entries` (YAML text per key) in its free-form mapping `key`."""
    body = "".join(f"  {k}: {v}\n" for k, v in entries.items())
    return text.replace(f"{key}: {{}}\n", f"{key}:\n{body}")


# ------------------------------------------------------------------------------- encodings
@HOSTILE
@given(kind=st.sampled_from(sorted(KINDS)), enc=st.sampled_from(sorted(ENCODINGS)))
def test_a_document_written_with_a_bom_reads_as_the_same_document(tmp_path_factory, kind, enc):
    plain = _write(tmp_path_factory, kind, lambda t: t)
    encoded = _write(tmp_path_factory, kind, lambda t: ENCODINGS[enc](t))
    assert KINDS[kind].load(encoded) == KINDS[kind].load(plain)


@HOSTILE
@given(kind=st.sampled_from(sorted(KINDS)), enc=st.sampled_from(["utf-8", "utf-16-le", "utf-16-be"]),
       at=st.floats(0.0, 1.0), junk=st.sampled_from([b"\xff", b"\xc3\x28", b"\x00\xd8\x41"]))
def test_bytes_that_are_not_text_are_one_line_naming_the_file(tmp_path_factory, kind, enc, at, junk):
    def damaged(t: str) -> bytes:
        raw = ENCODINGS.get(enc, lambda s: s.encode())(t)
        cut = int(len(raw) * at) & ~3  # on a code unit's boundary
        return raw[:cut] + junk + raw[cut:]

    path = _write(tmp_path_factory, kind, damaged)
    try:
        KINDS[kind].load(path)
    except ValueError as e:
        assert "\n" not in str(e) and str(path.parent) in str(e), e
    # (the junk may land inside a string a loader keeps as it is: accepted, never a crash)


# ------------------------------------------------------------------------------- nesting
@HOSTILE
@given(kind=st.sampled_from(sorted(KINDS)), depth=st.integers(65, 3000), opener=st.sampled_from(["[", '{"a": ']))
def test_nesting_past_the_bound_is_one_line_at_any_depth(tmp_path_factory, kind, depth, opener):
    closer = "]" if opener == "[" else "}"
    path = _write(tmp_path_factory, kind, opener * depth + "1" + closer * depth)
    _refused(kind, path, "deeper than any real one")


# ------------------------------------------------------------------------------- numbers
@HOSTILE
@given(kind=st.sampled_from(sorted(KINDS)), digits=st.integers(4301, 20_000))
def test_an_integer_too_long_to_convert_is_one_line(tmp_path_factory, kind, digits):
    number = "7" * digits
    if KINDS[kind].free:
        path = _write(tmp_path_factory, kind, lambda t: f"zz: {number}\n{t}")
    else:
        path = _write(tmp_path_factory, kind, lambda t: t.replace("{", f'{{"zz": {number}, ', 1))
    _refused(kind, path, "digits")


# ------------------------------------------------------------------------------- YAML aliases and tags
@HOSTILE
@given(kind=st.sampled_from(YAML_KINDS), levels=st.integers(4, 30), fanout=st.integers(2, 12))
def test_an_alias_bomb_is_refused_unexpanded(tmp_path_factory, kind, levels, fanout):
    if fanout**levels <= 1 << 22:
        levels = 23  # expansion past the bound, whatever the fan-out
    entries = {"a0": "&a0 [x" + ", x" * (fanout - 1) + "]"}
    for i in range(1, levels):
        entries[f"a{i}"] = f"&a{i} [" + ", ".join([f"*a{i - 1}"] * fanout) + "]"
    path = _write(tmp_path_factory, kind, lambda t: _with_free(t, KINDS[kind].free, entries))
    t0 = time.perf_counter()
    _refused(kind, path, "through its aliases")
    assert time.perf_counter() - t0 < 5.0


@HOSTILE
@given(kind=st.sampled_from(YAML_KINDS), shape=st.sampled_from(["&a [*a]", "&a {k: *a}", "&a [1, [2, *a]]"]))
def test_an_alias_inside_its_own_anchor_is_refused(tmp_path_factory, kind, shape):
    path = _write(tmp_path_factory, kind, lambda t: _with_free(t, KINDS[kind].free, {"loop": shape}))
    _refused(kind, path, "inside its own anchor")


@HOSTILE
@given(kind=st.sampled_from(YAML_KINDS),
       tag=st.sampled_from(["!!binary aGk=", "!!set {a, b}", "!!omap [a: 1]", "!!python/tuple [1]", "!custom x",
                            "!!timestamp 2024-01-01", "2024-01-01", "!!pairs [a: 1]"]))
def test_a_value_that_is_not_plain_data_is_refused(tmp_path_factory, kind, tag):
    path = _write(tmp_path_factory, kind, lambda t: _with_free(t, KINDS[kind].free, {"v": tag}))
    _refused(kind, path, "plain data")


@HOSTILE
@given(kind=st.sampled_from(YAML_KINDS), width=st.integers(1, 6), uses=st.integers(1, 8))
def test_aliases_within_the_bound_read_as_their_expansion(tmp_path_factory, kind, width, uses):
    anchored = {"base": "&b [" + ", ".join(f"'v{i}'" for i in range(width)) + "]"}
    anchored.update({f"use{j}": "*b" for j in range(uses)})
    expanded = {"base": "[" + ", ".join(f"'v{i}'" for i in range(width)) + "]"}
    expanded.update({f"use{j}": expanded["base"] for j in range(uses)})
    free = KINDS[kind].free
    a = _write(tmp_path_factory, kind, lambda t: _with_free(t, free, anchored))
    b = _write(tmp_path_factory, kind, lambda t: _with_free(t, free, expanded))
    assert KINDS[kind].load(a) == KINDS[kind].load(b)


def test_yaml_past_its_size_bound_is_refused_unparsed(tmp_path_factory, monkeypatch):
    from foundation import documents

    monkeypatch.setattr(documents, "MAX_YAML_BYTES", 2048)
    path = _write(tmp_path_factory, "model yaml", lambda t: t + "#" * 4096 + "\n")
    _refused("model yaml", path, "more than any real one")


# ------------------------------------------------------------------------------- the command
def _picasso(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "picasso", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_command_answers_an_alias_bomb_in_one_line_and_writes_nothing(tmp_path):
    """The real CLI in a process of its own: no traceback, one line, exit 2, no output file."""
    entries = {"a0": "&a0 [x, x, x, x, x, x, x, x, x]"}
    entries.update({f"a{i}": f"&a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 12)})
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_with_free(_model_yaml(tmp_path), "extra", entries))
    out = tmp_path / "out" / "plan.json"
    t0 = time.perf_counter()
    p = _picasso("plan", "--model", str(bomb), "--hardware", "local-cpu", "-o", str(out))
    err = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(err) == 1 and str(bomb) in err[0] and "through its aliases" in err[0], p.stderr
    assert "Traceback" not in p.stderr and not out.parent.exists()
    assert time.perf_counter() - t0 < 30


def test_the_command_reads_a_plan_that_powershell_wrote(tmp_path):
    text = _plan(tmp_path)
    plan = tmp_path / "plan.json"
    plan.write_bytes(ENCODINGS["utf-16-le"](text))  # `Get-Content a.json | Out-File plan.json` (Windows PowerShell)
    p = _picasso("simulate", str(plan), "--hardware", "local-cpu", "--set", "gpus_per_node=1", "--json")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    assert json.loads(p.stdout)["world_size"] == 1
