"""The documentation's runnable examples run as written.

Every fenced block of README.md and docs/guide.md whose info string is `bash runnable` or
`python runnable` runs, in document order, in one scratch folder (later blocks use the files
earlier ones wrote); a block that exits non-zero fails the test with its output."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/guide.md")
BLOCK = re.compile(r"^```(bash|python) runnable\n(.*?)^```$", re.S | re.M)

pytestmark = pytest.mark.dist  # the examples start gloo ranks


def runnable_blocks(doc: str) -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer((ROOT / doc).read_text())]


def test_every_doc_marks_examples_runnable():
    for doc in DOCS:
        kinds = {k for k, _ in runnable_blocks(doc)}
        assert "bash" in kinds, f"{doc}: no `bash runnable` block"
    assert "python" in {k for k, _ in runnable_blocks("docs/guide.md")}, "docs/guide.md: no `python runnable` block"


def test_readme_keeps_the_ci_test_command():
    # .ci/run runs exactly this line; README states it
    line = "pip install torch==2.13.0 --extra-index-url https://download.pytorch.org/whl/cpu -e '.[test,triton]' && python -m pytest -q"
    assert line in (ROOT / "README.md").read_text() and line in (ROOT / ".ci" / "run").read_text()


def test_runnable_blocks_run(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # `picasso` is this checkout's command, whichever console script is on PATH
    shell_prelude = f'set -euo pipefail\npicasso() {{ "{sys.executable}" -m picasso "$@"; }}\n'
    for doc in DOCS:
        for i, (kind, code) in enumerate(runnable_blocks(doc)):
            argv = ["bash", "-c", shell_prelude + code] if kind == "bash" else [sys.executable, "-c", code]
            p = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
            assert p.returncode == 0, f"{doc} block {i + 1} ({kind}) failed:\n{code}\n--- output:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
