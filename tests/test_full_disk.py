"""A full filesystem, for real: a small tmpfs filled up. A checkpoint save that runs out of
space leaves the previous checkpoint resumable; `synth`/`analyze`/`convert -o` onto a full
filesystem exit non-zero with one line and leave no partial file.

Mounting needs root, or a user namespace (`unshare -rm`, where the scenario then runs in a
child process); the tests skip with the reason where neither is possible.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_NAMESPACE = "PICASSO_TEST_IN_NAMESPACE"


def _mount(folder: Path, size: str) -> bool:
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)],
                         capture_output=True)
    return res.returncode == 0


def _fill(folder: Path, leave_bytes: int = 0) -> None:
    """Write a filler file until `folder`'s filesystem has at most `leave_bytes` free."""
    free = shutil.disk_usage(folder).free - leave_bytes
    with open(folder / "filler", "wb", buffering=0) as f:
        try:
            while free > 0:
                free -= f.write(b"\0" * min(free, 1 << 20))
            while leave_bytes == 0:
                f.write(b"\0" * 4096)
        except OSError:  # full
            pass


def _picasso(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "picasso", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})


def _one_line(res: subprocess.CompletedProcess, *words: str) -> None:
    lines = res.stderr.strip().splitlines()
    assert res.returncode != 0 and len(lines) == 1, (res.returncode, res.stderr)
    assert all(w in lines[0] for w in words), lines[0]
    assert "Traceback" not in res.stderr and "internal error" not in res.stderr


def scenario_checkpoint(fs: Path, work: Path) -> None:
    from planner.plan import PackPlan, Plan
    from planner.presets import get_model

    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(200), bottom_mlp=(16, 16), top_mlp=(8, 1))
    Plan(m, 2, 16, [PackPlan("pack0", m.table_names, "row_wise")]).save(work / "plan.json")
    base = ["run", str(work / "plan.json"), "--data", "synthetic", "--timeout", "60"]
    ck = fs / "ck"
    first = _picasso(*base, "--steps", "2", "--checkpoint", str(ck))
    assert first.returncode == 0, first.stderr
    size = sum(p.stat().st_size for p in ck.rglob("*") if p.is_file())
    _fill(fs, leave_bytes=size // 3)  # room for a part of the next version only
    full = _picasso(*base, "--steps", "2", "--resume", str(ck), "--checkpoint", str(ck))
    _one_line(full, "No space left on device")
    assert [p.name for p in ck.iterdir() if p.is_dir()] == [json.loads((ck / "manifest.json").read_text())["dir"]]
    again = _picasso(*base, "--steps", "1", "--resume", str(ck), "--json", env={"TMPDIR": str(work)})
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout)["start_step"] == 2  # the previous checkpoint resumed


def scenario_outputs(fs: Path, work: Path) -> None:
    data = work / "data.tsv"
    assert _picasso("synth", "--rows", "2000", "-o", str(data)).returncode == 0
    _fill(fs)
    for cmd in (["synth", "--rows", "2000"], ["analyze", str(data), "--format", "criteo"],
                ["convert", str(data), "--format", "criteo"]):
        out = fs / f"{cmd[0]}.out"
        res = _picasso(*cmd, "-o", str(out))
        _one_line(res, str(fs / cmd[0]), "No space left on device")  # analyze names its .npz beside
        assert sorted(p.name for p in fs.iterdir()) == ["filler"], (cmd[0], sorted(fs.iterdir()))


def _run_in_small_fs(scenario: Callable[[Path, Path], None], tmp_path: Path, size: str = "4m") -> None:
    fs = tmp_path / "fs"
    fs.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    if os.geteuid() == 0 and not os.environ.get("PICASSO_TEST_FORCE_UNSHARE"):
        if not _mount(fs, size):
            pytest.skip("cannot mount a tmpfs here (a container without CAP_SYS_ADMIN?)")
        try:
            scenario(fs, work)
        finally:
            subprocess.run(["umount", "-l", str(fs)], capture_output=True)
        return
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode:
        pytest.skip("needs root or user namespaces (unshare -rm) to mount a small tmpfs")
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from pathlib import Path; import tests.test_full_disk as t; "
            f"fs = Path({str(fs)!r}); assert t._mount(fs, {size!r}), 'mount failed in the namespace'; "
            f"t.{scenario.__name__}(fs, Path({str(work)!r}))")
    env = {k: v for k, v in os.environ.items() if k != "PICASSO_TEST_FORCE_UNSHARE"}
    res = subprocess.run(["unshare", "-rm", sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**env, "PYTHONPATH": str(ROOT), IN_NAMESPACE: "1"})
    if "mount failed in the namespace" in res.stderr:
        pytest.skip("cannot mount a tmpfs inside a user namespace here")
    assert res.returncode == 0, res.stderr[-3000:]


@pytest.mark.dist
def test_a_save_onto_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
    _run_in_small_fs(scenario_checkpoint, tmp_path)


def test_outputs_onto_a_full_disk_fail_with_one_line_and_leave_nothing(tmp_path):
    _run_in_small_fs(scenario_outputs, tmp_path)

