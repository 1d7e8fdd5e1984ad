"""The layers as DESIGN.md draws them: every module imports, imports point down, no import cycle."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# DESIGN.md's table: what each layer may import (besides itself and foundation)
MAY_IMPORT = {
    "foundation": set(),
    "traces": set(),
    "simulator": set(),
    "planner": {"traces", "simulator"},
    "executor": {"planner", "simulator", "traces", "csrc"},
    "csrc": set(),
    "validation": {"executor", "planner", "simulator", "traces"},
    "picasso": {"executor", "planner", "simulator", "traces", "validation", "csrc"},
}


def modules() -> dict[str, Path]:
    out = {}
    for layer in MAY_IMPORT:
        for f in sorted((ROOT / layer).rglob("*.py")):
            if "_build" in f.parts:
                continue
            name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = f
    return out


def imports(path: Path, top_level_only: bool) -> set[str]:
    """Project modules `path` imports (at module level only, or anywhere)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    out = set()
    for n in nodes:
        if isinstance(n, ast.Import):
            out |= {a.name for a in n.names}
        elif isinstance(n, ast.ImportFrom) and n.module and n.level == 0:
            out.add(n.module)
            out |= {f"{n.module}.{a.name}" for a in n.names}
    return {m for m in out if m.split(".")[0] in MAY_IMPORT}


def test_imports_point_down():
    wrong = []
    for name, path in modules().items():
        layer = name.split(".")[0]
        for m in imports(path, top_level_only=False):
            other = m.split(".")[0]
            if other not in (layer, "foundation") and other not in MAY_IMPORT[layer]:
                wrong.append(f"{name} imports {m}")
    assert not wrong, wrong


def test_no_import_cycle():
    mods = modules()
    # imports inside functions count too: a lazy import only hides a cycle
    graph = {n: {m for m in imports(p, top_level_only=False) if m in mods and m != n} for n, p in mods.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(n: str) -> None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph[n]):
            if state.get(m) == 1:
                raise AssertionError("import cycle: " + " -> ".join(stack[stack.index(m):] + [m]))
            if m not in state:
                visit(m)
        stack.pop()
        state[n] = 2

    for n in sorted(graph):
        if n not in state:
            visit(n)


@pytest.mark.parametrize("name", sorted(n for n in modules() if not n.startswith("csrc") and not n.endswith("__main__")))
def test_every_module_imports(name):
    importlib.import_module(name)


def test_picasso_is_thin():
    lines = sum(len(f.read_text().splitlines()) for f in (ROOT / "picasso").rglob("*.py"))
    assert lines < 1700, lines  # about 40 lines per sub-command and 100 for the parser itself


# The executor's wings (DESIGN.md): what each may import of the rest of the executor, besides itself.
# process/ starts and watches ranks and knows nothing of training; data/ reads rows; sparse/ and
# dense/ are the two halves of the model, neither of which knows the trainer or the worker; step/ is
# one rank's step over them; run/ (the rank's run around the step) may read every wing.
WINGS = {
    "executor.process": {"executor.run.config", "executor.run.result"},  # launch: the typed config in, the typed result back
    "executor.data": set(),
    "executor.sparse": {"executor.comm"},
    "executor.dense": set(),
    # the step knows the model's halves and the data, never the run around it
    "executor.step": {"executor.comm", "executor.sparse", "executor.dense", "executor.data"},
    "executor.measure": {"executor.process"},
}
# the documented seams between sparse/ and dense/: executor.sparse.kernels is the executor's one
# native-kernel dispatch (the embedding hot path and the dense interaction alike)
SEAMS = {
    ("executor.dense.model", "executor.sparse.kernels"): "the interaction's native kernel, through the dispatch",
    ("executor.sparse.kernels", "executor.dense.interaction"): "the interaction's reference, which the native matches",
}


def wing_breaches(mods: dict[str, Path]) -> list[str]:
    wrong = []
    for name, path in mods.items():
        wing = next((w for w in WINGS if name == w or name.startswith(w + ".")), None)
        if wing is None:
            continue
        for m in sorted(imports(path, top_level_only=False)):
            if not m.startswith("executor.") or m == wing or m.startswith(wing + "."):
                continue
            allowed = any(m == a or m.startswith(a + ".") for a in WINGS[wing])
            # `from executor.sparse import kernels` names the package too
            seam = any(name == a and (m == b or m.startswith(b + ".") or b.startswith(m + ".")) for a, b in SEAMS)
            if not (allowed or seam):
                wrong.append(f"{name} imports {m}")
    return wrong


def test_executor_wings_import_only_their_own_and_the_seams():
    assert not wing_breaches(modules()), wing_breaches(modules())


def test_a_wing_breach_is_caught(tmp_path):
    """The rule is live: a dense module that reads the trainer, and a process module that
    reads a sparse one, are both named."""
    (tmp_path / "a.py").write_text("from executor.step.trainer import Trainer\n")
    (tmp_path / "b.py").write_text("def f():\n    from executor.sparse import embedding\n")
    found = wing_breaches({"executor.dense.a": tmp_path / "a.py", "executor.process.b": tmp_path / "b.py"})
    assert found == ["executor.dense.a imports executor.step.trainer", "executor.dense.a imports executor.step.trainer.Trainer",
                     "executor.process.b imports executor.sparse", "executor.process.b imports executor.sparse.embedding"]
