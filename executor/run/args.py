"""Command-line flags shared by `picasso run` and its workers (`python -m executor`).

Torch-free, so the command line starts without importing torch.
"""

from __future__ import annotations

import argparse
import math
from enum import Enum


class GraphMode(str, Enum):
    """--cuda-graph: replay one rank's step as a CUDA graph (executor.run.cuda_graph)."""

    AUTO = "auto"  # where the plan allows it (one rank on a GPU, ...), silently eager elsewhere
    ON = "on"  # the same, and a refusal is said
    OFF = "off"  # never


MAX_STEPS = 1 << 40  # steps of one model: a trillion is beyond any run; more is a mistake or a forged count


def add_training_args(p: argparse.ArgumentParser) -> None:
    """The data, evaluation and timing flags `picasso run` passes through to its workers
    unchanged: one definition for both command lines."""
    p.add_argument("--epochs", type=int, help="passes over the data instead of --steps (the seeded order changes per epoch)")
    p.add_argument("--data-seed", type=int, help="seed of a dataset's per-epoch order (default: the plan's seed)")
    p.add_argument("--strict", action="store_true", help="stop at the first malformed training row (default: skip, count)")
    p.add_argument("--eval-data", help="held-out data (file, glob or converted folder): AUC and logloss at the end")
    p.add_argument("--eval-format", help="format of --eval-data (default: --format)")
    p.add_argument("--eval-every", type=int, default=0, help="also evaluate every N steps")
    p.add_argument("--eval-batch", type=int, help="rows per evaluation batch (default: the global batch)")
    p.add_argument("--warmup", type=int, help="untimed first steps (default: a quarter of the steps, 1 to 3; with a CUDA graph its 3 eager steps and its capture)")
    p.add_argument("--cuda-graph", nargs="?", const=GraphMode.ON.value, default=GraphMode.AUTO.value,
                   choices=[m.value for m in GraphMode],
                   help="replay the steady-state step as one CUDA graph: auto (default) where the plan allows "
                        "it (one rank on a GPU), on (also say why not), off")


def worker_flags(args: argparse.Namespace) -> list[str]:
    """`picasso run`'s flags checked (one ValueError line each) and turned into the workers' own."""
    if args.keep < 1:
        raise ValueError(f"--keep must be at least 1, got {args.keep}")
    if not (math.isfinite(args.timeout) and args.timeout > 0):
        raise ValueError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.verify_tolerance is not None and not (math.isfinite(args.verify_tolerance) and args.verify_tolerance >= 0):
        raise ValueError(f"--verify-tolerance must be a finite number >= 0, got {args.verify_tolerance}")
    if args.warmup is not None and args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    for flag, n in (("--steps", args.steps), ("--epochs", args.epochs)):
        if n is not None and n > MAX_STEPS:
            raise ValueError(f"{flag} {n} is beyond any run this machine could finish (at most {MAX_STEPS:,})")
    extra = ["--timeout", str(args.timeout), "--keep", str(args.keep)]
    for flag in ("warmup", "trace", "timeline", "checkpoint", "resume", "verify_tolerance", "check_every", "epochs",
                 "data_seed", "eval_data", "eval_format", "eval_every", "eval_batch"):
        v = getattr(args, flag)
        if v is not None:
            extra += [f"--{flag.replace('_', '-')}", str(v)]
    if args.op_timing:
        extra.append("--op-timing")
    if args.check_every is not None and args.check_every < 1:
        raise ValueError(f"--check-every must be at least 1, got {args.check_every}")
    if args.strict:
        extra.append("--strict")
    if args.verify:
        extra.append("--verify")
    if args.preload:
        extra.append("--preload")
    extra += ["--cuda-graph", GraphMode(args.cuda_graph).value]
    if args.steps < 1 or (args.epochs is not None and args.epochs < 1):
        raise ValueError("--steps and --epochs must be at least 1")
    if args.eval_every < 0:
        raise ValueError("--eval-every must be 0 (only at the end) or positive")
    return extra
