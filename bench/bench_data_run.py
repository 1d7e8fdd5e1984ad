"""Input during `picasso run`: the time steps wait for input, and peak memory per rank.

wait:    the planner's plan (local-cpu, 2 ranks, searched from a profile of the data) trains on a
         converted synthetic Criteo dataset and on the same rows as plain text (byte ranges);
         `input_wait` is the time each rank's timed steps waited for the loader, as a share of
         their step time. Timed: run it under `flock -x /work/bench.lock`.
memory:  one epoch at 2 ranks with a small model over each given converted dataset (e.g. 1 GB and
         10 GB of `picasso synth` text, converted); peak RSS per rank (the process's high-water
         mark, everything included) and the ratio between the datasets.

    python bench/bench_data_run.py wait [--rows 400000]
    python bench/bench_data_run.py memory DS_SMALL DS_LARGE

Both write bench/results/data_run/<machine>.json (each mode its own key).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from planner.sharding import Sharding

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from picasso.cli import main as picasso  # noqa: E402
from planner.plan import PackPlan, Plan  # noqa: E402
from planner.presets import get_model  # noqa: E402
from traces.dataset import Dataset  # noqa: E402

DEST = results_path("data_run")


def cli(*argv) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = picasso([*map(str, argv)])
    if rc != 0:
        raise SystemExit(f"picasso {argv[0]} failed ({rc})")
    text = out.getvalue()
    return json.loads(text[text.index("{"):]) if "--json" in argv else {}


def machine(note: str) -> dict:
    return {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
            "python": platform.python_version(), "load_average": os.getloadavg(), "note": note}


def save(key: str, doc: dict) -> None:
    cur = json.loads(DEST.read_text()) if DEST.exists() else {}
    cur[key] = doc
    DEST.write_text(json.dumps(cur, indent=2) + "\n")
    print(f"wrote {DEST} [{key}]")


def wait(args) -> None:
    from traces.synth import generate_criteo

    tmp = Path(tempfile.mkdtemp(prefix="bench-wait-"))
    text = tmp / "data.tsv"
    generate_criteo(text, args.rows, seed=0)
    cli("convert", text, "--format", "criteo", "-o", tmp / "ds")
    cli("analyze", text, "--format", "criteo", "-o", tmp / "profile.json", "--batch-size", 2 * args.batch)
    cli("plan", "--model", "dlrm-criteo-kaggle", "--hardware", "local-cpu", "--set", "gpus_per_node=2", "--profile",
        tmp / "profile.json", "--row-cap", "100000", "--batch-size", args.batch, "--time-budget", "5",
        "-o", tmp / "plan.json")
    rows = []
    for kind, data in (("dataset", tmp / "ds"), ("text byte ranges", text)):
        res = cli("run", tmp / "plan.json", "--data", data, "--steps", args.steps, "--json")
        w = res["input_wait"]
        rows.append({"data": kind, "plan": Plan.load(tmp / "plan.json").notes.get("label"),
                     "samples_per_s": res["samples_per_s"], "iteration_ms_p50": res["iteration_ms"]["p50"],
                     "input_wait_fraction_per_rank": w["fraction_of_step_per_rank"],
                     "input_wait_ms_per_rank": w["mean_ms_per_rank"]})
        print(f"{kind:17} {res['samples_per_s']:>9,.0f} samples/s, step p50 {res['iteration_ms']['p50']:.1f} ms, "
              f"input wait {max(w['fraction_of_step_per_rank']):.2%} of the step (worst rank)")
    save("wait", {"rows": args.rows, "batch_per_rank": args.batch, "steps": args.steps, "results": rows,
                  "machine": machine("shared 2-core machine, 2 gloo ranks, run under flock -x /work/bench.lock")})
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)


LOADER_RSS = """
import json, resource, sys
from dataclasses import replace
from executor.data.batches import Prefetcher, dataset_batches, feature_map, to_batch
from planner.presets import get_model
from traces.dataset import Dataset

def rss():
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS"))

ds, b = Dataset(sys.argv[1]), int(sys.argv[2])
m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(1000), bottom_mlp=(16, 16), top_mlp=(16, 1))
fmap = feature_map(m, ds.features)
before = rss()
steps = ds.rows // (2 * b)
def prepared():
    for raw in dataset_batches(ds, 2 * b, 0, b, seed=0, stop_step=steps):  # rank 0 of 2, one epoch
        yield to_batch(raw, m, fmap)
n = sum(len(x) for x in Prefetcher(prepared(), depth=4))
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"rows": n, "rss_before": before, "peak_rss": peak, "input_bytes": peak - before}))
"""


def loader_memory(ds: str, batch: int) -> dict:
    """Rank 0 of 2's input alone for one epoch (read, prepare, prefetch 4 batches) in a fresh process:
    its peak RSS above the RSS once torch and the layers are imported."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", LOADER_RSS, str(ds), str(batch)], capture_output=True, text=True,
                         env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def memory(args) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-mem-"))
    m = replace(get_model("dlrm-criteo-kaggle").with_row_cap(1000), bottom_mlp=(16, 16), top_mlp=(16, 1))
    Plan(m, 2, args.batch, [PackPlan("pack0", m.table_names, Sharding.ROW_WISE)]).save(tmp / "plan.json", hot_ids={})
    rows = []
    for ds in args.datasets:
        d = Dataset(ds)
        size = sum(f.stat().st_size for f in Path(ds).rglob("*") if f.is_file())
        res = cli("run", tmp / "plan.json", "--data", ds, "--epochs", "1", "--check-every", "100", "--json")
        rss = res["peak_memory"]["host_rss_bytes_per_rank"]
        alone = loader_memory(ds, args.batch)
        rows.append({"input_peak_bytes_rank0": alone["input_bytes"], "loader_alone": alone,"dataset": str(ds), "rows": d.rows, "dataset_bytes": size, "text_bytes": sum(
            s["bytes"] for s in d.manifest["sources"]), "steps": res["steps"], "samples_per_s": res["samples_per_s"],
            "peak_rss_bytes_per_rank": rss})
        print(f"{ds}: {d.rows:,} rows, {size / 1e9:.1f} GB converted, one epoch ({res['steps']} steps, "
              f"{res['samples_per_s']:,.0f} samples/s): peak RSS per rank "
              + ", ".join(f"{x / 2**20:.0f} MiB" for x in rss)
              + f"; input alone (rank 0, fresh process): {alone['input_bytes'] / 2**20:.0f} MiB above its imports")
    small, large = max(rows[0]["peak_rss_bytes_per_rank"]), max(rows[-1]["peak_rss_bytes_per_rank"])
    print(f"largest/smallest dataset peak RSS: {large / small:.3f}")
    save("memory", {"model": "dlrm-criteo-kaggle, tables capped at 1,000 rows, MLPs 16-16 / 16-1",
                    "batch_per_rank": args.batch, "results": rows, "peak_rss_ratio_large_over_small": large / small,
                    "machine": machine("shared 2-core machine; RSS is the whole rank process's high-water mark "
                                       "(torch, model, input); run under the shared lock")})


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="mode", required=True)
    w = sub.add_parser("wait")
    w.add_argument("--rows", type=int, default=400_000)
    w.add_argument("--batch", type=int, default=2048)
    w.add_argument("--steps", type=int, default=60)
    mem = sub.add_parser("memory")
    mem.add_argument("datasets", nargs="+")
    mem.add_argument("--batch", type=int, default=8192)
    args = ap.parse_args()
    wait(args) if args.mode == "wait" else memory(args)


if __name__ == "__main__":
    main()
