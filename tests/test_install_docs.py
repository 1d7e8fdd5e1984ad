"""README says how to install for real: the CPU-only build and the CUDA one, their sizes and times,
the test time and a quicker subset; the test extra pulls only what the tests use."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python 3.11+ reads pyproject.toml itself")

ROOT = Path(__file__).resolve().parents[1]


def extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_readme_gives_the_cpu_and_cuda_installs_with_their_times():
    readme = (ROOT / "README.md").read_text()
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in readme
    assert "CUDA build" in readme and "keeps pip on the CPU build" not in readme
    assert re.search(r"\d+\s+minutes\s+on\s+a\s+2-core\s+machine\s+after\s+the\s+install", readme)  # the demo's time
    assert re.search(r"about\s+\d+\s+minutes\s+on\s+2\s+cores", readme)  # the tests' time
    assert 'python -m pytest -q -m "not slow and not dist"' in readme
    assert "docs/guide.md#install-and-tests" in readme
    guide = (ROOT / "docs" / "guide.md").read_text()
    assert "## Install and tests" in guide and "criteo_kaggle_head8k" in guide and "du -sh" in guide


def test_the_test_extra_pulls_only_what_the_tests_use():
    test = " ".join(extras()["test"])
    assert "triton" not in test and "pandas" not in test and "numpy" not in test
    assert any(r.startswith("triton==") for r in extras()["triton"])
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    numpy = [r for r in deps if r.startswith("numpy")]
    # one bound for numpy, in the core: pip resolves it once instead of fetching two versions
    assert numpy == ["numpy>=1.24,<2.3"] and not any("numpy" in r for e in extras().values() for r in e)
