"""The layers as DESIGN.md draws them: every module imports, imports point down, no import cycle."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import picasso

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


# picasso/ is the command and the API, wiring only (DESIGN.md): one module per sub-command, and
# these modules of shared wiring, each for its reason. No rule of any layer lives here.
WIRING = {
    "__init__": "the API's names",
    "__main__": "python -m picasso",
    "api": "the Python API: the commands as functions",
    "cli": "the parser built from the commands; every error as one line",
    "layout_args": "the click-log layout flags analyze and convert share",
}
# the stateful wiring types: argparse's parser and help formatter
WIRING_CLASSES = {"cli.Parser", "cli.DefaultsShown"}
ENTRY_POINTS = ("register", "run")  # what cli.py calls of every command


def _records_or_errors(node: ast.ClassDef) -> bool:
    """A class that holds no logic: an exception, or a record (a NamedTuple or a dataclass without methods)."""
    bases = {ast.unparse(b) for b in node.bases}
    if any(b.endswith(("Error", "Exception", "Interrupt")) for b in bases):
        return True
    plain = not any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) for n in node.body)
    dataclass = any(ast.unparse(d).split("(")[0].endswith("dataclass") for d in node.decorator_list)
    return plain and ("NamedTuple" in bases or dataclass)


def picasso_breaches(files: dict[str, Path], commands: tuple[str, ...]) -> list[str]:
    """What in picasso/ is neither a command nor the API (`files`: module name under picasso/ -> path).

    Each module is a sub-command of cli.COMMANDS (defining register and run) or listed in
    WIRING; a module-level class is an exception, a record or listed in WIRING_CLASSES; a
    command's public functions are its entry points and what another picasso module calls
    (the API); the API module's are the package's __all__."""
    trees = {name: ast.parse(path.read_text()) for name, path in files.items()}
    read: dict[str, set[str]] = {}  # names each module reads of others (imported, or as attributes)
    for name, tree in trees.items():
        read[name] = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        read[name] |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    exported = set(picasso.__all__)
    wrong = []
    for name, tree in trees.items():
        where = f"picasso/{name.replace('.', '/')}.py"
        command = name.startswith("commands.") and name != "commands.__init__"
        if command and name.removeprefix("commands.") not in {c.replace("-", "_") for c in commands}:
            wrong.append(f"{where}: not a sub-command of cli.COMMANDS")
        elif not command and name not in WIRING and name != "commands.__init__":
            wrong.append(f"{where}: neither a command nor listed wiring")
        defs = {n.name: n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
        if command and not all(e in defs for e in ENTRY_POINTS):
            wrong.append(f"{where}: a command defines {' and '.join(ENTRY_POINTS)}")
        for d in defs.values():
            if isinstance(d, ast.ClassDef):
                if not _records_or_errors(d) and f"{name}.{d.name}" not in WIRING_CLASSES:
                    wrong.append(f"{where}: class {d.name} holds logic")
                continue
            if d.name.startswith("_") or d.name in ENTRY_POINTS:
                continue
            if command and not any(d.name in r for other, r in read.items() if other != name):
                wrong.append(f"{where}: {d.name} is neither an entry point nor read by the API")
            elif name == "api" and d.name not in exported:
                wrong.append(f"{where}: {d.name} is not part of the API (picasso.__all__)")
    return wrong


def _picasso_files() -> dict[str, Path]:
    return {".".join(f.relative_to(ROOT / "picasso").with_suffix("").parts): f
            for f in sorted((ROOT / "picasso").rglob("*.py"))}


def test_picasso_holds_the_commands_and_the_api_only():
    from picasso.cli import COMMANDS

    found = picasso_breaches(_picasso_files(), COMMANDS)
    assert not found, found


def test_a_rule_parked_in_picasso_is_caught(tmp_path):
    """The rule is live: a cost model put among the commands, a public helper of a command that
    nothing outside it calls, and a module that is no command are all named."""
    from picasso.cli import COMMANDS

    (tmp_path / "plan.py").write_text(
        "def register(sub, common):\n    pass\n\n\ndef run(args):\n    return estimate(args)\n\n\n"
        "def estimate(args):\n    return 0\n")
    (tmp_path / "cost.py").write_text("class CostModel:\n    def rate(self):\n        return 1.0\n")
    files = {**_picasso_files(), "commands.plan": tmp_path / "plan.py", "commands.cost": tmp_path / "cost.py"}
    assert picasso_breaches(files, COMMANDS) == [
        "picasso/commands/plan.py: estimate is neither an entry point nor read by the API",
        "picasso/commands/cost.py: not a sub-command of cli.COMMANDS",
        "picasso/commands/cost.py: a command defines register and run",
        "picasso/commands/cost.py: class CostModel holds logic",
    ]


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
    ("executor.dense.model", "executor.sparse.syncfree"): "the interaction's Triton kernels, live where the embedding ones are",
    ("executor.sparse.syncfree", "executor.dense.interaction_triton"): "loaded and self-checked with the embedding kernels",
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
