"""Command-line flags shared by `picasso run` and its workers (`python -m executor`).

Torch-free, so the command line starts without importing torch.
"""

from __future__ import annotations

import argparse


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
    p.add_argument("--warmup", type=int, help="untimed first steps (default: 1 to 3, a quarter of the steps)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="capture the steady-state step as one CUDA graph and replay it (one rank on a GPU; "
                        "a plan it does not fit runs without it, said in one line)")
