"""The binary loader against its previous version, in one command, per CPU-second.

Reads rank 0's share of 4096-row global batches (one process, world 1) from a converted
dataset with this tree's traces.dataset and with the version at BASE (taken from git),
interleaved, best of rounds. Figures are rows per CPU-second of the process (time.process_time):
the loader is one thread, so on a loaded machine this is what a quiet core would do, where
wall-clock samples/s mostly measures the other processes.

With `--text FILE` it also times the text loader by byte ranges (rank 0 of 1 and of 2) the same way.

    python bench/bench_loader_versions.py DATASET [--base e70a561] [--text FILE]
        -> bench/results/loader_versions/<machine>.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from traces import dataset as current  # noqa: E402


def load_base(rev: str):
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:traces/dataset.py"], capture_output=True,
                         text=True, check=True).stdout
    path = Path(tempfile.mkdtemp(prefix="bench-loader-")) / "base_dataset.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("base_dataset", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["base_dataset"] = mod
    spec.loader.exec_module(mod)
    return mod


def rate(mod, path: str, steps: int, g: int) -> tuple[float, float]:
    ds = mod.Dataset(path)
    order = mod.EpochOrder(ds.rows, 1)
    per = ds.rows // g
    c0, w0, n = time.process_time(), time.perf_counter(), 0
    for s in range(steps):
        e, k = divmod(s, per)
        n += len(ds.read(order.segments(e, k * g, k * g + g)).labels)
    return n / (time.process_time() - c0), n / (time.perf_counter() - w0)


def text_rates(path: str, batch: int, rounds: int) -> dict:
    import itertools

    from executor.data.text_ranges import TextRanges

    rows = sum(1 for _ in open(path, "rb"))
    out = {}
    for world in (1, 2):
        best = (0.0, 0.0)
        for _ in range(rounds):
            tr = TextRanges(path, "criteo", world, 0, batch)
            c0, w0 = time.process_time(), time.perf_counter()
            n = sum(len(x) for x in itertools.islice(tr.local(0, None), rows // world // batch))
            best = max(best, (n / (time.process_time() - c0), n / (time.perf_counter() - w0)))
        out[f"rank 0 of {world}"] = {"rows_per_cpu_second": best[0], "wall_samples_per_s": best[1]}
        print(f"text by byte ranges, rank 0 of {world}: {best[0]:,.0f} rows per CPU-second, {best[1]:,.0f} wall")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dataset")
    ap.add_argument("--base", default="e70a561")
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--text", help="a plain Criteo TSV to time the byte-range text loader on")
    args = ap.parse_args()
    base = load_base(args.base)
    best = {"base": (0.0, 0.0), "current": (0.0, 0.0)}
    for _ in range(args.rounds):
        for name, mod in (("base", base), ("current", current)):
            cpu, wall = rate(mod, args.dataset, args.steps, args.batch)
            best[name] = (max(best[name][0], cpu), max(best[name][1], wall))
    ratio = best["current"][0] / best["base"][0]
    print(f"rows per CPU-second: base {best['base'][0]:,.0f}, current {best['current'][0]:,.0f} ({ratio:.2f}x); "
          f"wall samples/s: base {best['base'][1]:,.0f}, current {best['current'][1]:,.0f}")
    out = {"dataset": args.dataset, "base": args.base, "batch": args.batch, "steps": args.steps,
           "rows_per_cpu_second": {k: v[0] for k, v in best.items()},
           "wall_samples_per_s": {k: v[1] for k, v in best.items()}, "current_over_base": ratio,
           **({"text_byte_ranges": text_rates(args.text, args.batch, 3), "text": args.text} if args.text else {}),
           "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                       "python": platform.python_version(), "load_average": os.getloadavg(),
                       "note": "shared 2-core machine under load (the exclusive lock was not granted); "
                               "best of interleaved rounds, page cache warm"}}
    dest = results_path("loader_versions")
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {dest}")


if __name__ == "__main__":
    main()
