"""The command line's contract, fuzzed: every sub-command's numeric flags and every kind of document
the commands read (model and hardware specs, plans, click logs), mutated from valid ones.

For each invocation (in-process, stdout and stderr captured):
- exit 0 or 2, never a traceback or an internal error;
- a refusal (2) is one line `picasso CMD: error: ...` (warnings may precede it), and leaves the work
  folder exactly as it was: no output, no temp or hidden work folder;
- no input is changed (hashed before and after);
- it ends within a time bound (a hang guard, far above what any case takes).
Cases that are refused by rule (a flag outside its domain, a key written twice) must be refused.
Deterministic: a fixed number of examples per kind, derandomized.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import re
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from picasso.cli import main

TIME_BOUND_S = 30.0
FUZZ = settings(max_examples=6, derandomize=True, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))

# values outside every domain of their kind of flag
BAD_WHOLE = ["0", "-1", "1.5", "nan", "inf", "-inf", "1e30", "abc", "", "0x10"]
BAD_SEED = ["-1", "1.5", "nan", "inf", "abc", "", "1e30"]
BAD_SECONDS = ["0", "-1", "nan", "inf", "-inf", "1e30", "abc", ""]
BAD_RATE = ["-0.1", "1.5", "nan", "inf", "abc", ""]
BAD_ZIPF = ["0", "-3", "nan", "inf", "11", "abc"]


# ------------------------------------------------------------------------------- the seeds
@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Path:
    """Valid inputs every case starts from: a small Criteo log, a plan, a model and hardware spec."""
    folder = tmp_path_factory.mktemp("seeds")
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert main(["synth", "--rows", "300", "-o", str(folder / "log.tsv")]) == 0, out.getvalue()
        assert main(["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--baseline", "naive",
                     "--row-cap", "1000", "-o", str(folder / "plan.json")]) == 0, out.getvalue()
        assert main(["analyze", str(folder / "log.tsv"), "--format", "criteo", "-o", str(folder / "prof.json")]) == 0
        assert main(["convert", str(folder / "log.tsv"), "--format", "criteo", "-o", str(folder / "ds")]) == 0
        assert main(["plan", "--model", "dlrm-criteo-kaggle", "--print-spec"]) == 0
    spec = out.getvalue()
    (folder / "model.yaml").write_text(spec[spec.index("name:"):])
    import yaml

    from simulator.hardware import PRESET_DIR

    hw = yaml.safe_load((PRESET_DIR / "local-cpu.yaml").read_text())
    (folder / "hw.json").write_text(json.dumps(hw, indent=1))
    return folder


@dataclass
class Outcome:
    rc: int
    err: list[str]


def _tree(folder: Path) -> dict[str, str]:
    """Every path under `folder` (hidden ones included) with a hash of each file's bytes."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for d in dirs:
            out[os.path.relpath(os.path.join(root, d), folder)] = "dir"
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = hashlib.sha256(Path(p).read_bytes()).hexdigest()
    return out


def _invoke(command: str, argv: list[str], work: Path, inputs: list[Path], must_refuse: bool) -> Outcome:
    """Run `picasso argv` in `work` and hold it to the contract."""
    before = _tree(work)
    held = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in inputs if p.is_file()}
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exc:  # argparse refuses by exiting
                rc = exc.code
    finally:
        os.chdir(cwd)
    took = time.perf_counter() - t0
    lines = [x for x in err.getvalue().splitlines() if x.strip()]
    shown = f"picasso {' '.join(map(repr, argv))} -> {rc}: {lines[-3:]}"
    assert took < TIME_BOUND_S, f"{shown}: took {took:.1f} s"
    assert "Traceback" not in err.getvalue() + out.getvalue(), shown
    assert rc in (0, 2), shown
    if must_refuse:
        assert rc == 2, shown
    for p, digest in held.items():
        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest, f"{shown}: changed input {p}"
    if rc == 2:
        errors = [x for x in lines if not x.startswith(("warning:", "note:"))]
        assert len(errors) == 1 and errors[0] == lines[-1], shown
        assert errors[0].startswith(f"picasso {command}: error: ") or errors[0].startswith("picasso: error:"), shown
        assert _tree(work) == before, f"{shown}: left {sorted(set(_tree(work)) - set(before))}"
    return Outcome(rc, lines)


@contextlib.contextmanager
def _work(seeds: Path):
    """A fresh work folder holding copies of the seeds, and an `out` folder for outputs."""
    with tempfile.TemporaryDirectory(prefix="picasso-fuzz-") as tmp:
        work = Path(tmp)
        for f in seeds.iterdir():
            (shutil.copytree if f.is_dir() else shutil.copy2)(f, work / f.name)
        yield work


# ------------------------------------------------------------------------------- numeric flags
def _flags(work: Path) -> dict[str, tuple[list[str], dict[str, list[str]]]]:
    """Per sub-command: a valid command line and its numeric flags with values outside their domain."""
    return {
        "synth": (["synth", "--rows", "10", "-o", "out/s.tsv"],
                  {"--rows": BAD_WHOLE, "--seed": BAD_SEED, "--zipf-s": BAD_ZIPF, "--click-rate": BAD_RATE}),
        "analyze": (["analyze", "log.tsv", "--format", "criteo", "-o", "out/p.json", "--html", "out/p.html"],
                    {"--batch-size": BAD_WHOLE, "--scale-to": BAD_WHOLE, "--exact-cap": BAD_WHOLE}),
        "convert": (["convert", "log.tsv", "--format", "criteo", "-o", "out/ds"], {"--shard-rows": BAD_WHOLE}),
        "plan": (["plan", "--model", "model.yaml", "--hardware", "hw.json", "--baseline", "naive", "-o", "out/p.json",
                  "--trace", "out/t.json"],
                 {"--batch-size": BAD_WHOLE, "--scale-to": BAD_WHOLE, "--row-cap": BAD_WHOLE,
                  "--time-budget": BAD_SECONDS}),
        "run": (["run", "plan.json", "--data", "log.tsv", "--steps", "2", "--checkpoint", "out/ck", "--trace",
                 "out/t.json"],
                {"--steps": BAD_WHOLE, "--nproc": BAD_WHOLE, "--keep": BAD_WHOLE, "--check-every": BAD_WHOLE,
                 "--eval-every": BAD_WHOLE, "--eval-batch": BAD_WHOLE, "--timeout": BAD_SECONDS}),
        "simulate": (["simulate", "plan.json", "--engine", "fast", "--trace", "out/t.json"], {"--scale-to": BAD_WHOLE}),
        "export": (["export", "plan.json", "--torchrec", "-o", "out/e.json"], {"--gpus-per-node": BAD_WHOLE}),
        "calibrate": (["calibrate", "--quick", "-o", "out/hw.json"], {"--nproc": BAD_WHOLE}),
        "validate": (["validate", "--data", "log.tsv", "-o", "out/val"],
                     {"--row-cap": BAD_WHOLE, "--plans": BAD_WHOLE, "--nproc-max": BAD_WHOLE, "--steps": BAD_WHOLE,
                      "--timed-seconds": BAD_SECONDS, "--max-steps": BAD_WHOLE, "--repeats": BAD_WHOLE,
                      "--run-timeout": BAD_SECONDS}),
        "demo": (["demo", "-o", "out/demo"],
                 {"--rows": BAD_WHOLE, "--row-cap": BAD_WHOLE, "--batch": BAD_WHOLE, "--steps": BAD_WHOLE,
                  "--run-repeats": BAD_WHOLE, "--plans": BAD_WHOLE, "--repeats": BAD_WHOLE}),
    }


@st.composite
def bad_flag(draw):
    table = _flags(Path("."))
    command = draw(st.sampled_from(sorted(table)))
    _, flags = table[command]
    flag = draw(st.sampled_from(sorted(flags)))
    return command, flag, draw(st.sampled_from(flags[flag]))


@settings(FUZZ, max_examples=60)
@given(case=bad_flag())
@example(case=("run", "--eval-batch", "0"))
@example(case=("plan", "--batch-size", "0"))
@example(case=("synth", "--rows", "1e30"))
@example(case=("export", "--gpus-per-node", "-3"))
def test_a_numeric_flag_outside_its_domain_is_refused(seeds, case):
    command, flag, value = case
    with _work(seeds) as work:
        base, _ = _flags(work)[command]
        res = _invoke(command, [*base, f"{flag}={value}"], work, [work / f for f in os.listdir(work)],
                      must_refuse=True)
        assert flag in res.err[-1], res.err


# ------------------------------------------------------------------------------- documents
_DOCS = {  # document -> a command line reading it
    "model.yaml": ["plan", "--model", "model.yaml", "--hardware", "hw.json", "--baseline", "naive", "-o", "out/p.json"],
    "hw.json": ["plan", "--model", "model.yaml", "--hardware", "hw.json", "--baseline", "naive", "-o", "out/p.json"],
    "plan.json": ["simulate", "plan.json", "--engine", "fast", "--trace", "out/t.json"],
    "prof.json": ["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--profile", "prof.json",
                  "--baseline", "naive", "--row-cap", "1000", "-o", "out/p.json"],
}
_PLAN_EXPORT = ["export", "plan.json", "--torchrec", "-o", "out/e.json"]
# read only where a key is written twice: an odd value a run accepts would train for real
_MANIFESTS = {"ds/manifest.json": ["run", "plan.json", "--data", "ds", "--steps", "2", "--checkpoint", "out/ck"]}


def _duplicate_key(text: str, yaml_doc: bool, pick: int) -> tuple[str, str]:
    """`text` with one key written twice in its mapping (the `pick`-th key, modulo their count)."""
    if yaml_doc:
        keys = [m for m in re.finditer(r"^( *)([A-Za-z_][A-Za-z0-9_]*):( .*)?$", text, re.M)]
        m = keys[pick % len(keys)]
        return text[: m.end()] + "\n" + m.group(0) + text[m.end():], m.group(2)
    keys = list(re.finditer(r'"([A-Za-z_][A-Za-z0-9_.:]*)"\s*:', text))
    m = keys[pick % len(keys)]
    return text[: m.start()] + f'"{m.group(1)}": 0, ' + text[m.start():], m.group(1)


@settings(FUZZ, max_examples=30)
@given(doc=st.sampled_from(sorted({**_DOCS, **_MANIFESTS})), pick=st.integers(0, 10_000), export=st.booleans())
@example(doc="model.yaml", pick=1, export=False)
@example(doc="hw.json", pick=3, export=False)
@example(doc="plan.json", pick=5, export=True)
@example(doc="prof.json", pick=2, export=False)
@example(doc="ds/manifest.json", pick=4, export=False)
def test_a_key_written_twice_in_any_document_is_refused(seeds, doc, pick, export):
    with _work(seeds) as work:
        path = work / doc
        text, key = _duplicate_key(path.read_text(), doc.endswith(".yaml"), pick)
        path.write_text(text)
        argv = _PLAN_EXPORT if export and doc == "plan.json" else {**_DOCS, **_MANIFESTS}[doc]
        res = _invoke(argv[0], argv, work, [f for f in work.rglob("*") if f.is_file()], must_refuse=True)
        assert doc in res.err[-1] and repr(key) in res.err[-1], res.err


_ODD_VALUES = [float("nan"), float("inf"), -1, 0, 1e300, 1e-300, "x", None, [], {}, True, 2**70]


def _leaves(doc, path=()):
    """Paths of the numbers in a parsed document."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _leaves(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _leaves(v, (*path, i))
    elif isinstance(doc, (int, float)) and not isinstance(doc, bool):
        yield path


@settings(FUZZ, max_examples=60)
@given(doc=st.sampled_from(sorted(_DOCS)), pick=st.integers(0, 10_000), value=st.sampled_from(_ODD_VALUES))
def test_an_odd_value_in_any_document_keeps_the_contract(seeds, doc, pick, value):
    import yaml

    with _work(seeds) as work:
        path = work / doc
        parsed = yaml.safe_load(path.read_text()) if doc.endswith(".yaml") else json.loads(path.read_text())
        leaves = list(_leaves(parsed))
        where = leaves[pick % len(leaves)]
        node = parsed
        for k in where[:-1]:
            node = node[k]
        node[where[-1]] = value
        path.write_text(yaml.safe_dump(parsed) if doc.endswith(".yaml") else json.dumps(parsed))
        _invoke(_DOCS[doc][0], _DOCS[doc], work, list(work.iterdir()), must_refuse=False)


# ------------------------------------------------------------------------------- click logs
def _mutate_log(raw: bytes, kind: str, at: int) -> bytes:
    lines = raw.split(b"\n")
    i = at % max(len(lines) - 1, 1)
    if kind == "long_field":  # a field past csv's and the readers' limits, in the first lines
        lines[i] = lines[i].replace(b"\t", b"\t" + b"f" * (200 << 10), 1)
    elif kind == "wide":
        lines[i] = b"\t".join([b"1"] * 6000)
    elif kind == "nul":
        lines[i] = lines[i][:5] + b"\0" + lines[i][5:]
    elif kind == "cut":
        return raw[: at % len(raw)]
    elif kind == "crlf":
        return raw.replace(b"\n", b"\r\n")
    elif kind == "blank":
        return b"\n" * (1 + at % 50)
    elif kind == "garbage":
        return bytes((at * 7919 + k) % 256 for k in range(4096))
    elif kind == "gzip_cut":
        z = gzip.compress(raw)
        return z[: max(len(z) // 2, 10)]
    return b"\n".join(lines)


_LAYOUTS = (("--format", "criteo"), ("--format", "csv", "--sep", "tab", "--no-header", "--dense", "c2,c3"))


@settings(FUZZ, max_examples=30)
@given(kind=st.sampled_from(["long_field", "wide", "nul", "cut", "crlf", "blank", "garbage", "gzip_cut"]),
       at=st.integers(0, 10_000), command=st.sampled_from(["analyze", "convert"]), layout=st.sampled_from(_LAYOUTS))
@example(kind="long_field", at=1, command="analyze", layout=_LAYOUTS[1])
@example(kind="wide", at=0, command="convert", layout=_LAYOUTS[0])
def test_a_mutated_click_log_keeps_the_contract(seeds, kind, at, command, layout):
    with _work(seeds) as work:
        path = work / "log.tsv"
        path.write_bytes(_mutate_log(path.read_bytes(), kind, at))
        out = "out/p.json" if command == "analyze" else "out/ds"
        _invoke(command, [command, "log.tsv", *layout, "-o", out], work, [path], must_refuse=False)


@pytest.mark.parametrize("compressed", [False, True])
def test_a_log_of_one_huge_line_is_refused_in_bounded_time(seeds, compressed):
    """One line past the readers' line limit: refused (naming the limit) within the time bound, gzip
    or not; a reader that re-scans its growing buffer takes minutes here."""
    from traces.readers import MAX_LINE_BYTES

    with _work(seeds) as work:
        path = work / ("huge.gz" if compressed else "huge.tsv")
        body = b"7" * (MAX_LINE_BYTES + (1 << 20))
        if compressed:
            path.write_bytes(gzip.compress(body, compresslevel=1))
        else:
            path.write_bytes(body)
        res = _invoke("analyze", ["analyze", path.name, "--format", "criteo", "-o", "out/p.json"], work, [path],
                      must_refuse=True)
        assert f"{MAX_LINE_BYTES >> 20} MiB" in res.err[-1], res.err
