"""`RunConfig`: every setting of one run, declared once.

`picasso run`'s flags are generated from its fields (foundation.settings), `picasso.run(...)`,
validation and the benchmarks build it directly, and the launcher hands it to every rank as one
JSON file. Each field's check runs when the config is built, so a value out of its domain is
refused in one line naming its flag before any work starts.

Torch-free, so the command line starts without importing torch.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from enum import Enum

from foundation.files import atomic_write_text
from foundation.settings import SettingError, check_settings, count, number, setting, text, to_plain


class GraphMode(str, Enum):
    """--cuda-graph: replay one rank's step as a CUDA graph (executor.run.cuda_graph)."""

    AUTO = "auto"  # where the plan allows it (one rank on a GPU, ...), silently eager elsewhere
    ON = "on"  # the same, and a refusal is said
    OFF = "off"  # never


MAX_STEPS = 1 << 40  # steps of one model: a trillion is beyond any run; more is a mistake or a forged count
MAX_ROWS = 1 << 40  # rows of one batch or of synthetic data
MAX_TIMEOUT_S = 30 * 86400.0  # a collective waiting a month is a hang (and larger overflows a timedelta)
MAX_PORT = 65535
MAX_NODES = 1 << 20  # foundation.fields.MAX_RANKS
MAX_SEED = (1 << 63) - 1
MAX_KEEP = 1 << 20


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    plan: str = setting(help="plan JSON (from `picasso plan`)", check=text, positional=True)
    data: str = setting(help="click-log file or glob, a folder from `picasso convert` (each rank reads only its "
                             "rows), or 'synthetic'", check=text)
    format: str = setting("criteo", "data format: criteo, avazu, csv, parquet, libsvm", text)
    nproc: int | None = setting(None, "workers on this machine (default: the plan's world size / nnodes)",
                                count(1, MAX_NODES))
    nnodes: int = setting(1, "machines taking part", count(1, MAX_NODES))
    node_rank: int = setting(0, "this machine's index among --nnodes", count(0, MAX_NODES))
    master_addr: str = setting("127.0.0.1", "rendezvous address: node 0 listens on it only (loopback by default)",
                               text)
    master_port: int | None = setting(None, "rendezvous port (default: a free one; set it for --nnodes > 1)",
                                      count(1, MAX_PORT))
    steps: int = setting(20, "training steps (global batches)", count(1, MAX_STEPS))
    epochs: int | None = setting(None, "passes over the data instead of --steps (the seeded order changes per "
                                       "epoch)", count(1, MAX_STEPS))
    data_seed: int | None = setting(None, "seed of a dataset's per-epoch order (default: the plan's seed)",
                                    count(0, MAX_SEED))
    strict: bool = setting(False, "stop at the first malformed training row (default: skip, count)")
    eval_data: str | None = setting(None, "held-out data (file, glob or converted folder): AUC and logloss at "
                                          "the end", text)
    eval_format: str | None = setting(None, "format of --eval-data (default: --format)", text)
    eval_every: int | None = setting(None, "also evaluate every N steps (default: only at the end)",
                                     count(1, MAX_STEPS))
    eval_batch: int | None = setting(None, "rows per evaluation batch (default: the global batch)",
                                     count(1, MAX_ROWS))
    warmup: int | None = setting(None, "untimed first steps (default: a quarter of the steps, 1 to 3; with a "
                                       "CUDA graph its 3 eager steps and its capture)", count(0, MAX_STEPS))
    cuda_graph: GraphMode = setting(GraphMode.AUTO, "replay the steady-state step as one CUDA graph: auto "
                                    "(default) where the plan allows it (one rank on a GPU), on (also say why "
                                    "not), off", const=GraphMode.ON)
    trace: str | None = setting(None, "write the measured Chrome trace (Perfetto) here", text)
    timeline: str | None = setting(None, "write the measured Timeline JSON here", text)
    checkpoint: str | None = setting(None, "save a checkpoint to this folder at the end", text)
    keep: int = setting(2, "checkpoint versions kept in the --checkpoint folder (default 2)", count(1, MAX_KEEP))
    resume: str | None = setting(None, "load this checkpoint first (any plan or world size of the same model)",
                                 text)
    verify: bool = setting(False, "compare the trained weights with a single-process reference started from "
                                  "the same state (keep --steps small); exit 1 above the tolerance")
    verify_tolerance: float | None = setting(None, "largest relative difference --verify accepts (default 1e-4 "
                                                   "for fp32 dense layers)", number(0.0, 1e30))
    preload: bool = setting(False, "read the whole data file before training starts")
    timeout: float = setting(120.0, "collective timeout in seconds (a dead rank stops the run)",
                             number(0.0, MAX_TIMEOUT_S, lo_open=True, unit=" of seconds"))
    op_timing: bool = setting(False, "time every op (on with --trace/--timeline); without it whole steps are "
                                     "timed")
    check_every: int = setting(10, "read the losses back every N steps (default 10): a non-finite loss stops "
                                   "the run there", count(1, MAX_STEPS))
    no_memory_check: bool = setting(False, "start the ranks even when the predicted peak memory exceeds this "
                                           "machine's")
    # set by the program, never on the command line
    synthetic_rows: int | None = setting(None, "rows of synthetic data (default: 8 global batches)",
                                         count(1, MAX_ROWS), cli=False)
    no_timing: bool = setting(False, "never record per-op events", cli=False)
    result: str | None = setting(None, "rank 0 writes the result JSON here (the launcher's file)", text,
                                 cli=False)

    def __post_init__(self) -> None:
        check_settings(self)
        if not self.node_rank < self.nnodes:
            raise SettingError(f"--node-rank must be in [0, {self.nnodes - 1}] for --nnodes {self.nnodes}, "
                               f"got {self.node_rank}")
        # with --epochs the rank learns the step count from the data, and checks --warmup there
        if self.epochs is None and self.warmup is not None and self.warmup >= self.steps:
            raise SettingError(f"--warmup {self.warmup} leaves no timed step of --steps {self.steps} "
                               f"(at most {self.steps - 1})")

    def to_json(self) -> str:
        return json.dumps(to_plain(self), indent=1) + "\n"

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_text(path, self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike) -> RunConfig:
        """The config a launcher wrote (its own file: the size is its own, no limits needed)."""
        from foundation.settings import from_plain

        with open(path, encoding="utf-8") as f:
            try:
                d = json.load(f)
            except json.JSONDecodeError as exc:
                raise SettingError(f"{path}: a run config is not JSON (line {exc.lineno}: {exc.msg})") from None
        return from_plain(cls, d, str(path))
