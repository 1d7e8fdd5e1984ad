"""Where a bench writes its result: bench/results/<bench>/<machine>[-<variant>].json, one file
per question and machine, overwritten by each run (history stays in git)."""

from __future__ import annotations

import os
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def machine_name() -> str:
    """`h100`, `a100`, ... on a CUDA machine (the first device's model), else `cpu-<N>core`."""
    try:
        import torch
    except ImportError:  # a bench without torch runs on the CPU
        torch = None
    if torch is not None and torch.cuda.is_available():
        m = re.search(r"\b([A-Z]{1,2}\d{2,4})\b", torch.cuda.get_device_name(0))
        if m:
            return m.group(1).lower()
    return f"cpu-{os.cpu_count()}core"


def results_path(bench: str, variant: str | None = None, machine: str | None = None) -> Path:
    """The result file of `bench` on this (or the named) machine, folder created."""
    name = machine or machine_name()
    path = RESULTS / bench / (f"{name}-{variant}.json" if variant else f"{name}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path
