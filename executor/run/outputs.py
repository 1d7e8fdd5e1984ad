"""What `picasso run` reads and writes, declared to foundation.outputs before any rank starts."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from executor.run.checkpoint import is_checkpoint_folder
from foundation.outputs import Outputs


def _data_paths(data: str | None) -> list[str]:
    if not data or data == "synthetic":
        return []
    return sorted(glob.glob(data)) if glob.has_magic(data) and not os.path.exists(data) else [data]


def run_outputs(plan: str, data: str, eval_data: str | None, resume: str | None, trace: str | None,
                timeline: str | None, checkpoint: str | None) -> Outputs:
    """The run's inputs (plan and its hot IDs, data, held-out data, the checkpoint resumed) and
    outputs (trace, timeline, the checkpoint folder, which a resume may read from as well)."""
    outs = Outputs()
    outs.read("PLAN", plan).read("PLAN's hot IDs", Path(plan).with_suffix(".hot.npz"))
    outs.read("--data", _data_paths(data)).read("--eval-data", _data_paths(eval_data)).read("--resume", resume)
    outs.file("--trace", trace).file("--timeline", timeline)
    outs.folder("--checkpoint", checkpoint, "checkpoint", legacy=is_checkpoint_folder, inputs_inside=("--resume",))
    return outs
