"""Binary files given as text data: one line naming the file and what it is, a non-zero
exit, no traceback and no "Exception ignored" at exit, for analyze, convert and run."""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from planner.plan import PackPlan, Plan
from planner.presets import get_model
from traces.filetype import looks_binary

ROOT = Path(__file__).resolve().parents[1]
CASES = {  # file -> words the error must hold
    "ls": "an ELF executable",
    "random.gz": "binary data inside its gzip stream",
    "array.npy": "a NumPy .npy array",
    "table.parquet": "this is a Parquet file, not text: try --format parquet",
    "arrays.npz": "a zip archive",
    "random.bin": "binary data, not text",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("binary")
    rng = np.random.default_rng(0)
    elf = Path(sys.executable).resolve().read_bytes()[:200_000]
    assert elf.startswith(b"\x7fELF")
    (d / "ls").write_bytes(elf)
    (d / "random.gz").write_bytes(gzip.compress(rng.bytes(200_000)))
    np.save(d / "array.npy", np.arange(5000))
    np.savez(d / "arrays.npz", a=np.arange(5000))
    pq.write_table(pa.table({"0": list(range(1000)), "1": [str(i) for i in range(1000)]}), d / "table.parquet")
    (d / "random.bin").write_bytes(bytes(b for b in rng.bytes(200_000) if b))  # no NUL byte, still not text
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(200), bottom_mlp=(16, 16), top_mlp=(8, 1))
    Plan(m, 1, 16, [PackPlan("pack0", m.table_names, "row_wise")]).save(d / "plan.json")
    return d


def _picasso(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp)}
    return subprocess.run([sys.executable, "-m", "picasso", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def _check(res: subprocess.CompletedProcess, path: Path, expect: str) -> None:
    lines = (res.stdout + res.stderr).strip().splitlines()
    assert res.returncode != 0, res
    assert len(lines) == 1, lines
    assert str(path) in lines[0] and expect in lines[0], lines[0]
    assert "Traceback" not in lines[0] and "internal error" not in lines[0]


@pytest.mark.parametrize("command,name", [("analyze", n) for n in sorted(CASES)]
                         + [("convert", n) for n in ("ls", "random.gz", "table.parquet")])
def test_binary_file_as_criteo_text_is_one_line(files, tmp_path, command, name):
    out = tmp_path / ("out.json" if command == "analyze" else "out")
    res = _picasso(command, str(files / name), "--format", "criteo", "-o", str(out), tmp=tmp_path)
    _check(res, files / name, CASES[name])
    assert not out.exists() and not list(tmp_path.glob("out*"))  # nothing partial left behind


@pytest.mark.dist
@pytest.mark.parametrize("name", ["ls", "random.gz", "array.npy", "table.parquet"])
def test_binary_file_as_run_data_is_one_line(files, tmp_path, name):
    res = _picasso("run", str(files / "plan.json"), "--data", str(files / name), "--steps", "2", tmp=tmp_path)
    _check(res, files / name, CASES[name])


def test_text_is_not_binary():
    assert not looks_binary(b"1\t2\t\tab12cd34\r\n" * 100)
    assert not looks_binary("étiquette,ünïcode,名前\n".encode() * 100)
    assert looks_binary(b"a\0b\n") and looks_binary(bytes(range(1, 32)) * 10)
