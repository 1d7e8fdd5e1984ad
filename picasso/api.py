"""The loop in Python: analyze -> plan -> simulate (what-if) -> run -> compare, and the trained
model out: export_model -> load_model / score.

Each function is the matching command's own work (`picasso/commands/*`): the keyword
arguments are its flags, and it returns the layers' objects instead of printing them.
Bad input raises ValueError (or OSError) with the line the command would print."""

from __future__ import annotations

import contextlib
import io
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from executor.run.model_file import Exported
    from executor.run.reference import RecModel
    from executor.run.result import RunResult
    from planner.plan import Plan
    from planner.whatif import SweepPoint
    from simulator.timeline import Timeline
    from traces.profile import AccessProfile
    from validation.compare import RunComparison

PathLike = str | os.PathLike


def _args(command: str, *positional: Any, **flags: Any):
    """The command's parsed flags: `name=value` as `--name value` (repeated for a list, alone for
    True, left out for None/False), so defaults and checks are the command's own."""
    from picasso.cli import build_parser

    argv = [command, *map(str, positional)]
    for name, value in flags.items():
        flag = "-o" if name == "output" else "--" + name.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            argv.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                argv += [flag, str(v)]
        else:
            argv += [flag, str(value)]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return build_parser().parse_args(argv)
    except SystemExit:  # argparse's reason is its last line
        raise ValueError(f"picasso.{command}: {err.getvalue().strip().splitlines()[-1]}") from None


def analyze(data: PathLike, format: str = "criteo", *, output: PathLike | None = None, batch_size: int = 4096,
            scale_to: int | None = None, cardinality: Sequence[str] = (), html: PathLike | None = None,
            strict: bool = False, **layout: Any) -> AccessProfile:
    """Profile a click log's ID accesses (`picasso analyze`); writes `output` when given."""
    from picasso.commands import analyze as cmd

    args = _args("analyze", data, format=format, output=output, batch_size=batch_size, scale_to=scale_to,
                 cardinality=list(cardinality), html=html, strict=strict, **layout)
    return cmd.execute(args)[0]


def plan(model: str, hardware: str, profile: PathLike | None = None, *, output: PathLike | None = None,
         overrides: Sequence[str] = (), baseline: str | None = None, batch_size: int | None = None,
         row_cap: int | None = None, scale_to: int | None = None, time_budget: float = 20.0,
         **flags: Any) -> Plan:
    """Search a plan, or build `baseline` (naive, torchrec-like, dp-hot-only, torchrec), and explain
    it (`picasso plan`); the plan carries its prediction. It is written to `output` only when given
    (`Plan.save(path)` writes it, hot IDs included, later)."""
    from picasso.commands import plan as cmd

    args = _args("plan", model=model, hardware=hardware, profile=profile, output=output, set=list(overrides),
                 baseline=baseline, batch_size=batch_size, row_cap=row_cap, scale_to=scale_to,
                 time_budget=time_budget, json=True, **flags)
    args.output = output and str(output)  # the command's default file is the command's, not the API's
    return cmd.execute(args).plan


def _load(plan_: Plan | PathLike) -> Plan:
    from planner.plan import Plan

    return plan_ if isinstance(plan_, Plan) else Plan.load(plan_)


def simulate(plan: Plan | PathLike, hardware: str | None = None, *, overrides: Sequence[str] = (),
             profile: PathLike | None = None, engine: str = "simpy") -> Timeline:
    """The plan's predicted timeline (`picasso simulate`): on its own hardware, or `hardware`,
    with `overrides` such as `nic_bw=100Gbit/s`; `makespan_us()` is the predicted iteration."""
    from planner.whatif import inputs_for, predict

    p, hw, access = inputs_for(_load(plan), hardware, overrides, profile and str(profile))
    return predict(p, hw, access, engine).evaluation.result.timeline


def sweep(plan: Plan | PathLike, key: str, values: Sequence[str], hardware: str | None = None, *,
          overrides: Sequence[str] = (), profile: PathLike | None = None, engine: str = "simpy") -> list[SweepPoint]:
    """The plan predicted once per value of one hardware key (`picasso simulate --sweep KEY=V1,V2`)."""
    from planner.whatif import inputs_for
    from planner.whatif import sweep as sweep_

    p, hw, access = inputs_for(_load(plan), hardware, overrides, profile and str(profile))
    return sweep_(p, hw, access, key, [str(v) for v in values], engine)


def run(plan: PathLike, data: PathLike, *, format: str = "criteo", nproc: int | None = None, steps: int = 20,
        **settings: Any) -> RunResult:
    """Train the saved plan for real on `nproc` local ranks (`picasso run`); settings such as
    `op_timing=True`, `verify=True`, `epochs=1`, `checkpoint="ck"` are executor.run.config.RunConfig's
    fields, the command's flags."""
    from dataclasses import fields

    from executor.run.config import RunConfig
    from picasso.commands import run as cmd

    known = {f.name for f in fields(RunConfig) if f.metadata.get("cli", True)}
    unknown = sorted(set(settings) - known)
    if unknown:
        raise ValueError(f"picasso.run: {unknown[0]!r} is not a run setting (known: {', '.join(sorted(known))})")
    res = cmd.execute(RunConfig(plan=str(plan), data=str(data), format=format, nproc=nproc, steps=steps,
                                **{k: str(v) if isinstance(v, os.PathLike) else v for k, v in settings.items()}))
    if res is None:
        raise ValueError("picasso.run: this node's ranks report nothing (node 0 does)")
    failed = cmd.verify_failure(res)
    if failed:
        raise ValueError(failed)
    return res


def compare(plan: PathLike, result: RunResult, hardware: str | None = None, *, overrides: Sequence[str] = (),
            profile: PathLike | None = None) -> RunComparison:
    """A run's step and largest ops against the plan's prediction (`picasso compare`)."""
    from picasso.commands.compare import compare as compare_

    return compare_(str(plan), result, hardware, list(overrides), profile and str(profile))


def export_model(checkpoint: PathLike, output: PathLike, *, plan: PathLike | None = None) -> Exported:
    """Write a checkpoint's trained model (any plan or world size) as one safetensors file of whole
    tables and dense weights (`picasso export-model`); `plan` only for checkpoints without a model spec."""
    from picasso.commands import export_model as cmd

    return cmd.execute(_args("export-model", checkpoint, output=output, plan=plan))


def load_model(path: PathLike) -> RecModel:
    """The plain-PyTorch model (torch.nn.Module) of a file `export_model` wrote."""
    from executor.run.model_file import load

    return load(path)


def score(model: PathLike, data: PathLike, *, format: str = "criteo", batch_size: int = 4096) -> dict:
    """AUC and logloss of an exported model on labelled data, in this process (`picasso score`)."""
    from picasso.commands import score as cmd

    return cmd.execute(_args("score", model, data=data, format=format, batch_size=batch_size))
