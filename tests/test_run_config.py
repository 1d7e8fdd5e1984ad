"""executor/run/config.py: one RunConfig from the command line and the API to every rank.

A setting added to RunConfig alone shows in `picasso run --help`, is taken by `picasso.run(...)`
and reaches every rank; every numeric setting has a domain, checked before any work."""

from __future__ import annotations

import ast
import dataclasses
import math
import sys
import tempfile
from dataclasses import fields, make_dataclass, replace
from pathlib import Path

import pytest

import picasso
from executor.run import config as config_module
from executor.run.config import RunConfig
from foundation.settings import count, setting
from picasso.cli import main
from planner.plan import PackPlan, Plan
from planner.presets import get_model
from tests.shared_ranks import shared_call

ROOT = Path(__file__).resolve().parents[1]
PROBE_HELP = "a setting this test adds to RunConfig"


def _small_plan(world: int) -> Plan:
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(100), bottom_mlp=(8, 16), top_mlp=(8, 1))
    return Plan(m, world, 8, [PackPlan("pack0", m.table_names, "row_wise")])


def _with_probe() -> tuple[type, list[tuple[object, type]]]:
    """RunConfig with one more field, bound wherever a module holds RunConfig (as an edit of the
    class would be); returns it and the bindings to restore."""
    base = config_module.RunConfig
    plus = make_dataclass("RunConfig", [("probe_every", int | None, setting(None, PROBE_HELP, count(1, 99)))],
                          bases=(base,), frozen=True, kw_only=True)
    swapped = [(m, base) for m in list(sys.modules.values()) if getattr(m, "RunConfig", None) is base]
    for m, _ in swapped:
        m.RunConfig = plus
    return plus, swapped


def _restore(swapped: list[tuple[object, type]]) -> None:
    """Every module back on the base class: those swapped, and any first imported during the swap
    (a command module imported by `picasso run` bound the added class and kept it for later tests)."""
    base = swapped[0][1] if swapped else config_module.RunConfig
    for m, _ in swapped:
        m.RunConfig = base
    for m in list(sys.modules.values()):
        cls = getattr(m, "RunConfig", None)
        if isinstance(cls, type) and cls is not base and issubclass(cls, base):
            m.RunConfig = base


@pytest.fixture()
def probe():
    plus, swapped = _with_probe()
    yield plus
    _restore(swapped)


@pytest.fixture()
def plan_path(tmp_path) -> Path:
    _small_plan(1).save(tmp_path / "plan.json")
    return tmp_path / "plan.json"


@pytest.fixture()
def launched(monkeypatch) -> list:
    """The configs `picasso run` hands the launcher (no rank starts)."""
    got: list = []

    def launch(config, **kw):
        got.append(config)
        return None  # as on another node: nothing to report

    monkeypatch.setattr("executor.process.launch.launch", launch)
    return got


def test_an_added_setting_is_a_flag_with_its_help_and_domain(probe, plan_path, launched, capsys):
    assert main(["run", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "--probe-every PROBE_EVERY" in out and PROBE_HELP in out
    assert main(["run", str(plan_path), "--data", "synthetic", "--probe-every", "4"]) == 0
    assert launched[-1].probe_every == 4
    assert main(["run", str(plan_path), "--data", "synthetic", "--probe-every", "0"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "picasso run: error: --probe-every must be at least 1, got 0")
    assert len(launched) == 1


def test_an_added_setting_is_an_api_keyword(probe, plan_path, launched):
    with pytest.raises(ValueError, match="this node's ranks report nothing"):  # the patched launch's None
        picasso.run(plan_path, "synthetic", steps=2, probe_every=3)
    assert launched[-1].probe_every == 3 and launched[-1].steps == 2
    with pytest.raises(ValueError, match="'probe_evry' is not a run setting"):
        picasso.run(plan_path, "synthetic", probe_evry=3)
    with pytest.raises(ValueError, match="--probe-every 100 is beyond"):
        picasso.run(plan_path, "synthetic", probe_every=100)


def rank_sees_the_probe(rank: int, world: int, plan: Plan, settings: dict) -> tuple[int | None, bool]:
    """For run_ranks: the config as the launcher writes it, read back by the rank's RunConfig with
    one added field, and a rank's run; what the rank's run saw of the field, and whether it reported."""
    import torch

    import executor.run.worker as worker

    plus, swapped = _with_probe()
    seen: dict = {}
    set_up, threads = worker.RankRun.set_up, torch.get_num_threads()

    def observed(self) -> None:
        set_up(self)
        seen["probe"] = self.cfg.probe_every

    worker.RankRun.set_up = observed
    try:
        with tempfile.TemporaryDirectory() as tmp:
            plan.save(Path(tmp) / "plan.json")
            plus(**{**settings, "plan": str(Path(tmp) / "plan.json")}).save(Path(tmp) / "config.json")
            result = worker.run_worker(worker.RunConfig.load(Path(tmp) / "config.json"))
    finally:
        worker.RankRun.set_up = set_up
        torch.set_num_threads(threads)
        _restore(swapped)
    return seen.get("probe"), result is not None


PROBED = shared_call(__name__, 2, rank_sees_the_probe, _small_plan(2),
                     {"plan": "-", "data": "synthetic", "steps": 2, "probe_every": 7})


@pytest.mark.dist
def test_an_added_setting_reaches_every_rank(shared_ranks):
    assert shared_ranks(PROBED) == [(7, True), (7, False)]  # rank 0 reports, both saw the value


# ---- every numeric setting has a domain, refused before any work ---------------------------------
def _bad_values() -> list[tuple[str, object]]:
    """Per numeric setting, values outside its domain: below the least, NaN and infinities."""
    cases = []
    hints = {f.name: f.type for f in fields(RunConfig)}
    for f in fields(RunConfig):
        if not f.metadata["cli"]:
            continue
        if "int" in hints[f.name]:
            least = 0 if f.name in ("node_rank", "data_seed", "warmup") else 1
            cases.append((f.name, least - 1))
        elif "float" in hints[f.name]:
            cases += [(f.name, v) for v in (math.nan, math.inf, -1.0)]
    return cases


@pytest.mark.parametrize("name,value", _bad_values())
def test_every_numeric_flag_out_of_its_domain_is_one_line_before_work(plan_path, launched, capsys, name, value):
    flag = "--" + name.replace("_", "-")
    rc = main(["run", str(plan_path), "--data", "synthetic", flag, str(value)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith(f"picasso run: error: {flag}"), err
    assert launched == []


@pytest.mark.parametrize("flags,line", [
    (["--steps", "2", "--warmup", "5"], "--warmup 5 leaves no timed step of --steps 2 (at most 1)"),
    (["--steps", "2", "--warmup", "2"], "--warmup 2 leaves no timed step of --steps 2 (at most 1)"),
    (["--eval-batch", "0"], "--eval-batch must be at least 1, got 0"),
    (["--eval-every", "0"], "--eval-every must be at least 1, got 0"),
    (["--timeout", "0"], "--timeout must be a finite number of seconds in (0, 2.592e+06], got 0.0"),
    (["--master-port", "70000"], "--master-port 70000 is beyond"),
])
def test_run_flag_faults_are_refused_up_front(plan_path, launched, capsys, flags, line):
    rc = main(["run", str(plan_path), "--data", "synthetic", *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and line in err[0], err
    assert launched == []


def test_defaults_are_the_ones_the_command_line_showed(plan_path, launched):
    assert main(["run", str(plan_path), "--data", "synthetic"]) == 0
    c = launched[-1]
    assert (c.steps, c.check_every, c.keep, c.timeout, c.cuda_graph, c.eval_every) == (20, 10, 2, 120.0, "auto", None)
    assert main(["run", str(plan_path), "--data", "synthetic", "--cuda-graph"]) == 0
    assert launched[-1].cuda_graph == "on"


def test_a_config_round_trips_through_its_file_and_refuses_strangers(tmp_path):
    c = RunConfig(plan="p.json", data="synthetic", steps=3, timeout=5, verify=True)
    assert isinstance(c.timeout, float)
    c.save(tmp_path / "c.json")
    assert RunConfig.load(tmp_path / "c.json") == c
    (tmp_path / "c.json").write_text('{"plan": "p.json", "data": "x", "stepz": 3}')
    with pytest.raises(ValueError, match="'stepz' is not a setting"):
        RunConfig.load(tmp_path / "c.json")
    with pytest.raises(ValueError, match="--steps must be an integer, got bool True"):
        RunConfig(plan="p.json", data="x", steps=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.steps = 4  # type: ignore[misc]


# ---- no argv is built to reach the executor --------------------------------------------------------
def _run_flags() -> set[str]:
    return {"--" + f.name.replace("_", "-") for f in fields(RunConfig)}


def _calls_the_executor(tree: ast.AST) -> bool:
    """The file imports the executor's launcher or starts `python -m executor` itself."""
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module in ("executor.process.launch", "executor.process.agent"):
            return True
        if isinstance(node, ast.List) and any(isinstance(e, ast.Constant) and e.value == "executor" for e in node.elts):
            return True
    return False


def test_no_argv_is_built_to_call_the_executor():
    flags = _run_flags()
    files = [*sorted((ROOT / "validation").glob("*.py")), *sorted((ROOT / "bench").glob("*.py")), ROOT / "picasso/api.py"]
    wrong = []
    for path in files:
        tree = ast.parse(path.read_text())
        if path.name != "api.py" and not _calls_the_executor(tree):
            continue  # e.g. a benchmark timing the `picasso run` command as a user types it
        in_lists = {e.value for n in ast.walk(tree) if isinstance(n, (ast.List, ast.Tuple))
                    for e in n.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
        wrong += [f"{path.relative_to(ROOT)}: {s}" for s in sorted(in_lists & flags)]
    assert wrong == []
    api = ast.parse((ROOT / "picasso/api.py").read_text())
    (run,) = [n for n in api.body if isinstance(n, ast.FunctionDef) and n.name == "run"]
    assert not [n for n in ast.walk(run) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "_args"]
    # the ranks take one file, not flags: no parser in a rank's run, no argv parameter on the launcher
    assert not [p for p in (ROOT / "executor/run").glob("*.py") if "argparse" in p.read_text()]
    from inspect import signature

    from executor.process.launch import launch

    assert list(signature(launch).parameters) == ["config", "timeout_s", "env", "progress"]
