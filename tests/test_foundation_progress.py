"""foundation.progress: bars through tqdm on a terminal only, silent under --json or a pipe; a
rank's steps reach the launcher's bar through the progress file, with samples/s."""

from __future__ import annotations

import io
import json
import sys

import pytest

import foundation.progress as fp

pytest.importorskip("tqdm", reason="the bars are drawn by tqdm")


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_silent_when_stderr_is_not_a_terminal_or_json(monkeypatch):
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    bar = fp.Progress("work", total=10)
    bar(5)
    bar.close()
    assert not bar.drawn and sys.stderr.getvalue() == ""
    monkeypatch.setattr(sys, "stderr", Tty())
    fp.silence()
    try:
        quiet = fp.Progress("work", total=10)
        quiet(5)
        quiet.close()
        assert not quiet.drawn and sys.stderr.getvalue() == ""
    finally:
        fp.silence(False)


def test_drawn_on_a_terminal_with_counts_and_rate(monkeypatch):
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    bar = fp.Progress("validate runs", total=4, unit="run", rate="samples/s")
    bar.update()
    bar.rate(16230.4)
    bar.extend(2)
    bar.update()
    bar.close()
    text = err.getvalue()
    assert "validate runs" in text and "/6" in text


def test_rank_steps_reach_the_launcher_bar(tmp_path, monkeypatch):
    """The worker's hook writes the file; the launcher's watcher draws steps and samples/s."""
    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    path = tmp_path / "progress.json"
    monkeypatch.setenv(fp.PROGRESS_FILE_ENV, str(path))
    monkeypatch.setattr(fp, "REDRAW_S", 0.0)
    watcher = fp.RankProgressWatcher(str(path), "run steps")
    fp.rank_step(1, 8, 1024)
    watcher.poll()
    fp.rank_step(8, 8, 1024)
    assert json.loads(path.read_text()) == {"done": 8, "total": 8, "samples": 1024, "phase": ""}
    watcher.poll()
    watcher.close()
    text = err.getvalue()
    assert "run steps" in text and "8/8" in text and "samples/s" in text


def test_no_progress_file_no_writes(tmp_path, monkeypatch):
    monkeypatch.delenv(fp.PROGRESS_FILE_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    fp.rank_step(1, 2, 64)
    assert list(tmp_path.iterdir()) == []


def test_first_native_build_is_announced(tmp_path, monkeypatch):
    """The C++ kernels' first build (about 40 s) says so; a cached build says it loads."""
    import contextlib

    from csrc import build

    labels = []

    @contextlib.contextmanager
    def seen(label, enabled=None):
        labels.append(label)
        yield

    monkeypatch.setattr(build, "activity", seen)
    monkeypatch.setattr(build, "_module", None)
    monkeypatch.setenv("PICASSO_NATIVE_BUILD_DIR", str(tmp_path))
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "load", lambda **kw: "module")
    assert build.load() == "module"
    assert labels and "first use, ~40 s" in labels[0]
    (build.build_dir() / "picasso_native.so").write_bytes(b"")
    monkeypatch.setattr(build, "_module", None)
    build.load()
    assert labels[1] == "loading the native C++ kernels"


@pytest.mark.dist
def test_a_run_reports_its_steps_to_the_launcher(tmp_path):
    """The worker's hook: rank 0 writes each step to the file the launcher names."""
    from dataclasses import replace

    from executor.process.launch import launch
    from executor.run.config import RunConfig
    from planner.plan import PackPlan, Plan
    from planner.presets import get_model
    from traces.synth import generate_criteo

    generate_criteo(tmp_path / "data.tsv", 400, seed=0)
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(200), bottom_mlp=(16, 16), top_mlp=(16, 1))
    Plan(m, 1, 32, [PackPlan("pack0", m.table_names, "replicated")]).save(tmp_path / "plan.json")
    path = tmp_path / "progress.json"
    config = RunConfig(plan=str(tmp_path / "plan.json"), data=str(tmp_path / "data.tsv"), nproc=1, steps=5)
    res = launch(config, progress=None, env={fp.PROGRESS_FILE_ENV: str(path)})
    assert res is not None and res.timed_steps > 0
    assert json.loads(path.read_text()) == {"done": 5, "total": 5, "samples": 32, "phase": ""}
