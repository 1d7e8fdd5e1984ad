"""A TorchRec that is installed but cannot load (fbgemm's native library missing: OSError or
RuntimeError at import, not ImportError) is unavailable: `picasso plan` plans and says so in one
line where it matters, and `--baseline torchrec` is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _plan(tmp_path: Path, error: str, *flags: str) -> subprocess.CompletedProcess:
    fake = tmp_path / "site" / "torchrec"
    fake.mkdir(parents=True, exist_ok=True)
    (fake / "__init__.py").write_text(f"raise {error}\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'site'}{os.pathsep}{ROOT}"}
    return subprocess.run([sys.executable, "-m", "picasso", "plan", "--model", "wide-deep", "--hardware", "local-cpu",
                           "--time-budget", "1", "-o", str(tmp_path / "plan.json"), *flags],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("error", ['OSError("libfbgemm_gpu_py.so: cannot open shared object file")',
                                   'RuntimeError("fbgemm_gpu: undefined symbol")'])
def test_plan_ignores_a_torchrec_that_cannot_load(tmp_path, error):
    res = _plan(tmp_path, error, "--explain")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "plan.json").is_file()
    [line] = [ln for ln in res.stdout.splitlines() if ln.startswith("torchrec baseline: n/a")]
    assert "does not import here" in line and error.split("(")[0] in line, line


def test_the_torchrec_baseline_names_why_it_is_unavailable(tmp_path):
    res = _plan(tmp_path, 'OSError("libfbgemm_gpu_py.so: cannot open shared object file")', "--baseline", "torchrec")
    err = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(err) == 1 and "Traceback" not in res.stderr, err
    assert "TorchRec is installed but does not import here" in err[0] and "libfbgemm_gpu_py.so" in err[0], err
