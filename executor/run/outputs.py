"""What `picasso run` reads and writes, declared to foundation.outputs before any rank starts."""

from __future__ import annotations

import glob
import os
from pathlib import Path

from foundation.documents import read_json
from foundation.outputs import Outputs

CHECKPOINT_FORMATS = ("picasso-checkpoint-1", "picasso-checkpoint-2", "picasso-checkpoint-3")


def _data_paths(data: str | None) -> list[str]:
    if not data or data == "synthetic":
        return []
    return sorted(glob.glob(data)) if glob.has_magic(data) and not os.path.exists(data) else [data]


def is_checkpoint_folder(path: Path) -> bool:
    """A checkpoint folder picasso wrote before folders carried a marker: its manifest says so, or
    it holds only the versions of a first save that never finished."""
    from executor.run.checkpoint import VERSION_RE

    try:
        m = read_json(path / "manifest.json", "checkpoint manifest", 16 << 20)
    except FileNotFoundError:
        return all(VERSION_RE.fullmatch(n) for n in os.listdir(path) if not n.startswith("."))
    except (OSError, ValueError):
        return False
    return isinstance(m, dict) and m.get("format") in CHECKPOINT_FORMATS


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
