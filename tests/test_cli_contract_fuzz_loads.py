"""The command line's contract, fuzzed where commands write and load: an output aimed at an input,
at another output or at a folder of someone else's kind; checkpoint pieces, a converted dataset's
`.npy` columns and a profile's arrays that disagree with what describes them; a frozen launcher.

Every case holds the contract of tests/test_cli_contract_fuzz.py (exit 2 in one line naming the
file or flag, no traceback, the work folder and every input as they were, a time bound). The valid
inputs (a 1-rank checkpoint, a converted dataset, a profile) are made once per module; each case
mutates a copy. Deterministic: a fixed number of examples per kind, derandomized.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from executor.process.process_tree import descendants
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from tests.run_tree import ROOT, cmdline, end_of_run, rank_pids, wait_for
from tests.test_cli_contract_fuzz import FUZZ, _invoke, _work

FOREIGN = {"name": "someone else's manifest", "version": 7}


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> Path:
    """A 1-rank plan and its checkpoint after 2 steps, a click log, its converted dataset and
    profile, and a folder holding someone else's manifest.json."""
    folder = tmp_path_factory.mktemp("load-seeds")
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(200), bottom_mlp=(8, 16), top_mlp=(8, 1))
    Plan(m, 1, 16, [PackPlan("pack0", m.table_names, "row_wise")], hot_rows={"C1": 10}).save(
        folder / "plan.json", hot_ids={"C1": np.arange(10)})
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        assert main(["synth", "--rows", "300", "-o", str(folder / "log.tsv")]) == 0, out.getvalue()
        assert main(["convert", str(folder / "log.tsv"), "--format", "criteo", "-o", str(folder / "ds")]) == 0
        assert main(["analyze", str(folder / "log.tsv"), "--format", "criteo", "-o", str(folder / "prof.json")]) == 0
        assert main(["run", str(folder / "plan.json"), "--data", "synthetic", "--steps", "2",
                     "--checkpoint", str(folder / "ck")]) == 0, out.getvalue()
    (folder / "foreign").mkdir()
    (folder / "foreign" / "manifest.json").write_text(json.dumps(FOREIGN))
    return folder


def _all_files(work: Path) -> list[Path]:
    return [f for f in work.rglob("*") if f.is_file() and not f.is_symlink()]


def _drop_kept_log(line: str) -> None:
    """A failed run keeps its worker log in a temp folder it names: not the work folder's, so
    taken away here."""
    m = re.search(r"full worker log: (\S+)/workers\.log\)", line)
    if m and Path(m.group(1)).name.startswith("picasso-run-"):
        shutil.rmtree(m.group(1), ignore_errors=True)


# ------------------------------------------------------------------------------- outputs
# command -> (its command line before outputs, its inputs, its file outputs, its folder outputs)
def _commands(data: str) -> dict[str, tuple[list[str], list[str], list[str], list[str]]]:
    plan_inputs = ["plan.json", "plan.hot.npz"]
    return {
        "run": (["run", "plan.json", "--data", data, "--steps", "2"], [*plan_inputs, data],
                ["--trace", "--timeline"], ["--checkpoint"]),
        "convert": (["convert", "log.tsv", "--format", "criteo"], ["log.tsv"], [], ["-o"]),
        "analyze": (["analyze", "log.tsv", "--format", "criteo"], ["log.tsv"], ["-o", "--html"], []),
        "plan": (["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--profile", "prof.json",
                  "--baseline", "naive", "--row-cap", "1000"], ["prof.json", "prof.npz"], ["-o", "--trace"], []),
        "export": (["export", "plan.json", "--torchrec"], plan_inputs, ["-o"], []),
        "simulate": (["simulate", "plan.json", "--hardware", "local-cpu", "--engine", "fast"], plan_inputs, ["--trace"], []),
    }


# where an output is aimed; every one is refused, for a file output and a folder output alike
FILE_TARGETS = ["input", "symlink", "hardlink", "inside_input", "other_output", "inside_checkpoint"]
FOLDER_TARGETS = ["input", "symlink", "inside_input", "holds_inputs", "foreign", "dataset", "checkpoint_file"]


def _target(work: Path, kind: str, inputs: list[str], pick: int, data: str) -> str | None:
    """The path an output is aimed at (made in `work` where it is a link), None where `kind` does
    not apply."""
    chosen = inputs[pick % len(inputs)]
    if kind == "input":
        return chosen
    if kind == "symlink":
        os.symlink(chosen, work / "link")
        return "link"
    if kind == "hardlink":
        if not (work / chosen).is_file():
            return None
        os.link(work / chosen, work / "hard")
        return "hard"
    if kind == "inside_input":
        folders = [i for i in inputs if (work / i).is_dir()]
        if not folders:
            return None
        inside = sorted(str(p.relative_to(work)) for p in (work / folders[0]).rglob("*") if p.is_file())
        return inside[pick % len(inside)]
    if kind == "holds_inputs":
        return "."
    if kind == "foreign":
        return "foreign"
    if kind == "dataset":
        return "ds" if data != "ds" else None
    if kind == "checkpoint_file":
        return "ck/manifest.json"
    return None


@settings(FUZZ, max_examples=40)
@given(command=st.sampled_from(["run", "convert", "analyze", "plan", "export", "simulate"]),
       data=st.sampled_from(["ds", "log.tsv"]), pick=st.integers(0, 10_000),
       kind=st.sampled_from(sorted(set(FILE_TARGETS + FOLDER_TARGETS))))
@example(command="run", data="ds", pick=0, kind="input")  # --checkpoint onto the dataset read
@example(command="run", data="log.tsv", pick=0, kind="foreign")  # --checkpoint into a foreign manifest's folder
@example(command="run", data="log.tsv", pick=0, kind="inside_checkpoint")  # --trace ck/manifest.json
@example(command="analyze", data="ds", pick=0, kind="input")  # -o onto the log read
@example(command="run", data="ds", pick=1, kind="inside_input")  # --trace over a dataset's file
@example(command="export", data="ds", pick=1, kind="input")  # -o over the plan's hot IDs
def test_an_output_aimed_at_an_input_another_output_or_a_foreign_folder_is_refused(seeds, command, data, pick,
                                                                                   kind):
    base, inputs, file_flags, folder_flags = _commands(data)[command]
    flags = [(f, "file") for f in file_flags if kind in FILE_TARGETS] + \
            [(f, "folder") for f in folder_flags if kind in FOLDER_TARGETS]
    assume(flags)
    flag, what = flags[pick % len(flags)]
    with _work(seeds) as work:
        argv = list(base)
        if kind == "other_output":
            others = [f for f in file_flags + folder_flags if f != flag]
            assume(others)
            target = "out.json"
            argv += [others[0], target]
        elif kind == "inside_checkpoint":
            assume(command == "run")
            target = "ck/manifest.json"
            argv += ["--checkpoint", "ck"]
        else:
            target = _target(work, kind, inputs, pick, data)
            assume(target is not None and not (command == "convert" and kind == "dataset"))
        argv += [flag, target]
        res = _invoke(command, argv, work, _all_files(work), must_refuse=True)
        _drop_kept_log(res.err[-1])
        assert flag in res.err[-1] or target in res.err[-1], (what, res.err)


# ------------------------------------------------------------------------------- checkpoint pieces
def _mutate_piece(piece: dict, how: str, field: str) -> None:
    t = piece[field]
    if how == "cut_rows":
        piece[field] = t[: max(len(t) // 2, 1) - 1].clone()
    elif how == "double_rows":
        piece[field] = torch.cat([t, t])
    elif how == "cut_cols":
        piece[field] = t[:, : t.shape[1] // 2].clone() if t.dim() == 2 else t[:, None].clone()
    elif how == "double_cols":
        piece[field] = torch.cat([t, t], 1) if t.dim() == 2 else torch.stack([t, t], 1)
    elif how == "integer":
        piece[field] = t.to(torch.int64)
    elif how == "scalar":
        piece[field] = t.sum()


def _rewrite_piece(ck: Path, how: str, field: str) -> Path:
    """Change one tensor of the checkpoint's piece and write the checksums anew, as a tool that
    edits checkpoints would: only the tensors' shapes and dtypes can tell."""
    m = json.loads((ck / "manifest.json").read_text())
    version = ck / m["dir"]
    f = version / "rank0.pack0.pt"
    saved = torch.load(f, weights_only=True)
    _mutate_piece(saved["pack"], how, field)
    torch.save(saved, f)
    raw = f.read_bytes()
    for mpath in (ck / "manifest.json", version / "manifest.json"):
        doc = json.loads(mpath.read_text())
        doc["files"][f.name] = {"bytes": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
        mpath.write_text(json.dumps(doc, indent=2))
    return f


@settings(FUZZ, max_examples=3)
@given(how=st.sampled_from(["cut_rows", "double_rows", "cut_cols", "double_cols", "integer", "scalar"]),
       field=st.sampled_from(["weight", "hot_weight", "rows", "hot_rows"]))
@example(how="double_rows", field="weight")  # loads silently without the check
@example(how="cut_rows", field="weight")
def test_a_checkpoint_piece_of_the_wrong_shape_or_dtype_is_refused_on_resume(seeds, how, field):
    with _work(seeds) as work:
        piece = _rewrite_piece(work / "ck", how, field)
        res = _invoke("run", ["run", "plan.json", "--data", "synthetic", "--steps", "3", "--resume", "ck"], work,
                      _all_files(work), must_refuse=True)
        _drop_kept_log(res.err[-1])
        assert piece.name in res.err[-1], res.err


# ------------------------------------------------------------------------------- .npy columns
_NPY_DESCRS = ["<f4", ">f4", "<f8", "<f2", "<i4", ">i4", "<u4", "<i8", ">i8", "<u8", "|i1", "|b1"]


def _rewrite_header(path: Path, descr: str | None, rows_scale: float) -> None:
    """The column's `.npy` header with another dtype or row count; its bytes as they were."""
    raw = path.read_bytes()
    size = 10 + int.from_bytes(raw[8:10], "little")
    header = raw[10:size].decode("latin1")
    if descr is not None:
        header = re.sub(r"'descr': '[^']*'", f"'descr': '{descr}'", header)
    if rows_scale != 1:
        header = re.sub(r"'shape': \((\d+)", lambda m: f"'shape': ({int(int(m.group(1)) * rows_scale)}", header)
    header = header.rstrip(" \n")
    header = header + " " * (size - 10 - len(header) - 1) + "\n"
    path.write_bytes(raw[:10] + header.encode("latin1") + raw[size:])


@settings(FUZZ, max_examples=20)
@given(column=st.sampled_from(["labels", "dense", "lens", "rowptr", "ids"]), descr=st.sampled_from(_NPY_DESCRS),
       rows_scale=st.sampled_from([1, 1, 1, 0.5, 2]))
@example(column="dense", descr=">f4", rows_scale=1)  # big-endian values would train into NaN
@example(column="ids", descr="<i4", rows_scale=1)
@example(column="dense", descr="<f8", rows_scale=1)
def test_a_dataset_column_whose_header_disagrees_with_the_format_is_refused(seeds, column, descr, rows_scale):
    from traces.dataset import COLUMN_DTYPES

    assume(descr != COLUMN_DTYPES[column] or rows_scale != 1)
    with _work(seeds) as work:
        f = work / "ds" / "shard-00000" / f"{column}.npy"
        _rewrite_header(f, None if descr == COLUMN_DTYPES[column] else descr, rows_scale)
        res = _invoke("run", ["run", "plan.json", "--data", "ds", "--steps", "2"], work, _all_files(work),
                      must_refuse=True)
        _drop_kept_log(res.err[-1])
        assert f"{column}.npy" in res.err[-1] or "shard-00000" in res.err[-1], res.err


# ------------------------------------------------------------------------------- profile arrays
@settings(FUZZ, max_examples=10)
@given(feature=st.integers(0, 25), how=st.sampled_from(["cut", "double", "reverse", "stability"]))
@example(feature=0, how="double")
def test_profile_arrays_that_disagree_with_their_summary_are_refused(seeds, feature, how):
    with _work(seeds) as work:
        npz = work / "prof.npz"
        with np.load(npz) as z:
            arrays = {k: z[k] for k in z.files}
        count = len(json.loads((work / "prof.json").read_text())["features"])
        k = f"f{feature % count}_"
        ids, counts = arrays[k + "ids"], arrays[k + "counts"]
        if how == "cut":  # fewer IDs than the exact count says
            assume(len(ids) > 1)
            arrays[k + "ids"], arrays[k + "counts"] = ids[: len(ids) // 2], counts[: len(ids) // 2]
        elif how == "double":  # more IDs and accesses than the summary
            arrays[k + "ids"], arrays[k + "counts"] = np.concatenate([ids, ids + ids.max() + 1]), np.tile(counts, 2)
        elif how == "reverse":  # counts no longer hottest first
            assume(len(counts) > 1 and counts[0] != counts[-1])
            arrays[k + "ids"], arrays[k + "counts"] = ids[::-1].copy(), counts[::-1].copy()
        else:  # one stability record too many
            s = arrays[k + "stability_sizes"]
            arrays[k + "stability_sizes"] = np.concatenate([s, s[-1:] if len(s) else np.ones(1, s.dtype)])
        np.savez(npz, **arrays)
        argv = ["plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--profile", "prof.json",
                "--baseline", "naive", "--row-cap", "1000", "-o", "out.json"]
        res = _invoke("plan", argv, work, _all_files(work), must_refuse=True)
        assert "prof.npz" in res.err[-1] and f"features[{feature % count}]" in res.err[-1], res.err


# ------------------------------------------------------------------------------- the launcher
def test_a_frozen_launcher_ends_the_run_within_its_timeout(seeds):
    """The launcher stopped (SIGSTOP) mid-run: the run ends in one line within --timeout and a
    margin, no process of its tree left, the work folder as it was."""
    from tests.test_cli_contract_fuzz import _tree

    timeout_s = 3.0
    with _work(seeds) as work:
        before = _tree(work)
        cmd = [sys.executable, "-m", "picasso", "run", "plan.json", "--data", "synthetic", "--steps", "100000000",
               "--timeout", str(timeout_s)]
        proc = subprocess.Popen(cmd, cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

        def agent_with_rank(tree: dict[int, str]) -> int | None:
            agents = [p for p in tree if "executor.process.agent" in cmdline(p)]
            return agents[0] if agents and rank_pids(tree) else None

        agent = wait_for(proc, agent_with_rank)
        time.sleep(1.0)
        tree = descendants(proc.pid)
        os.kill(agent, signal.SIGSTOP)
        frozen = time.monotonic()
        err, ended, left = end_of_run(proc, tree, timeout_s + 20.0)
        assert left == {}, [cmdline(p) for p in left]
        lines = err.strip().splitlines()
        assert proc.returncode == 2 and len(lines) == 1 and "rank launcher" in lines[0], err
        assert ended - frozen < timeout_s + 10.0, ended - frozen
        assert "Traceback" not in err
        assert _tree(work) == before
