"""Input pipeline speed: batches from a converted dataset vs parsing the text log.

One process, synthetic Criteo (26 categorical, 13 dense). For each source it measures
samples/s of (a) the loader alone (raw rows of a rank's share: labels, dense, per-feature
CSR) and (b) batch preparation as `picasso run` does it (to_batch: ID -> row, dense
transform, tensors), as rank 0 of 1 and of 2 ranks. Sources: a converted dataset (the rank
reads only its rows), plain text by byte ranges (the rank parses only its range), and, as the
baseline, text streamed whole (each rank parses everything and keeps its slice: how gzip is
read). Best of interleaved rounds. It also times `picasso convert` against `picasso analyze`
on the same file.

    flock -x /work/bench.lock python bench/bench_data.py [--rows 400000] [--batch 4096]

Writes bench/results/data/<machine>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from results_path import results_path  # noqa: E402

from executor.data.batches import dataset_batches, feature_map, global_batches, reader_chunks, to_batch
from executor.data.text_ranges import TextRanges
from planner.presets import get_model
from traces.convert import convert
from traces.dataset import Dataset
from traces.synth import generate_criteo


def text_source(path, g, lo, hi, steps):
    for i, gb in enumerate(global_batches(lambda: reader_chunks(path, "criteo"), g, epochs=1)):
        if i >= steps:
            return
        yield gb.slice(lo, hi)


def ranges_source(path, world, b, steps):
    import itertools

    yield from itertools.islice(TextRanges(path, "criteo", world, 0, b).local(0, None), steps)


def timed(make, model, prepare: bool) -> tuple[float, int]:
    t0 = time.perf_counter()
    rows, fmap = 0, {}
    for raw in make():
        if prepare:
            if not fmap:
                fmap = feature_map(model, raw.sparse)
            to_batch(raw, model, fmap)
        rows += len(raw)
    return rows / (time.perf_counter() - t0), rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=4096, help="rows per rank per step")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    model = replace(get_model("dlrm-criteo-kaggle").with_row_cap(100_000))
    tmp = Path(tempfile.mkdtemp(prefix="bench-data-"))
    text = tmp / "data.tsv"
    generate_criteo(text, args.rows, seed=0)
    from traces.profile import profile_file

    convert_s = analyze_s = float("inf")
    for i in range(2):  # best of 2, interleaved
        t0 = time.perf_counter()
        profile_file(text, "criteo", batch_size=args.batch)
        analyze_s = min(analyze_s, time.perf_counter() - t0)
        t0 = time.perf_counter()
        convert([str(text)], "criteo", tmp / f"ds{i}")
        convert_s = min(convert_s, time.perf_counter() - t0)
    ds = Dataset(tmp / "ds0")
    results = []
    for world in (1, 2):
        b = args.batch
        g = b * world
        steps = args.rows // g
        cases = {
            "text": lambda g=g, b=b, steps=steps: text_source(str(text), g, 0, b, steps),
            "text_ranges": lambda world=world, b=b, steps=steps: ranges_source(str(text), world, b, steps),
            "dataset": lambda g=g, b=b, steps=steps: dataset_batches(ds, g, 0, b, seed=1, stop_step=steps),
        }
        for stage in ("loader", "prepare"):
            best = {}
            for _ in range(args.rounds):
                for name, make in cases.items():
                    sps, _ = timed(make, model, stage == "prepare")
                    best[name] = max(best.get(name, 0.0), sps)
            row = {"world": world, "stage": stage, "text_whole_samples_per_s": best["text"],
                   "text_ranges_samples_per_s": best["text_ranges"],
                   "dataset_samples_per_s": best["dataset"], "ratio": best["dataset"] / best["text"],
                   "ranges_over_whole": best["text_ranges"] / best["text"]}
            results.append(row)
            print(f"world {world} rank 0, {stage:8}: text whole {best['text']:>10,.0f}/s  text byte ranges "
                  f"{best['text_ranges']:>10,.0f}/s  dataset {best['dataset']:>10,.0f}/s  "
                  f"(dataset/whole {row['ratio']:.1f}x, ranges/whole {row['ranges_over_whole']:.1f}x)")
    size = text.stat().st_size
    print(f"convert {args.rows:,} rows ({size / 1e6:.0f} MB) in {convert_s:.2f} s ({args.rows / convert_s:,.0f} rows/s); "
          f"analyze {analyze_s:.2f} s: convert/analyze speed {analyze_s / convert_s:.2f}x")
    out = {
        "rows": args.rows, "batch_per_rank": args.batch, "text_bytes": size,
        "dataset_bytes": sum(f.stat().st_size for f in (tmp / "ds0").rglob("*") if f.is_file()),
        "convert_seconds": convert_s, "convert_rows_per_s": args.rows / convert_s,
        "analyze_seconds": analyze_s, "convert_speed_over_analyze": analyze_s / convert_s,
        "results": results,
        "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "load_average": os.getloadavg(),
                    "note": "shared 2-core machine, run under flock -x /work/bench.lock (no tests or other "
                            "benchmarks meanwhile); best of interleaved rounds; page cache warm"},
    }
    dest = results_path("data")
    dest.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {dest}")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
