"""How long a model's tables take to initialise on a device (executor.sparse.init_rng).

Each table of the preset is built whole on the device as one rank's shard of a single-rank
plan would be, timed, then freed (so a model larger than the device still gets its time),
and the total is compared with the goal of starting the full dlrm-mlperf within 30 s.

Run: python bench/bench_table_init.py [--model dlrm-mlperf] [--device cuda] [--out F]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from executor.sparse.layout import init_packed_rows, pack_layout  # noqa: E402
from planner.plan import PackPlan, Plan  # noqa: E402
from planner.presets import get_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="dlrm-mlperf")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--row-cap", type=int, help="cap every table (a CPU run)")
    ap.add_argument("--out", help="JSON output (default bench/results/table_init/<machine>.json)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    model = get_model(args.model)
    if args.row_cap:
        model = model.with_row_cap(args.row_cap)
    machine = torch.cuda.get_device_name(dev) if dev.type == "cuda" else platform.processor() or "cpu"
    rows, total_s, total_b = [], 0.0, 0
    for t in model.tables:
        plan = Plan(model, 1, 1, [PackPlan(t.name, [t.name], "row_wise")])
        lay = pack_layout(plan, plan.packs[0], 0)
        packed = lay.local_packed_rows()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        start = time.perf_counter()
        w = init_packed_rows(model, lay, plan.seed, packed, device=dev)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        s = time.perf_counter() - start
        b = w.numel() * w.element_size()
        rows.append({"table": t.name, "rows": t.num_rows, "dim": t.dim, "seconds": s, "gb_per_s": b / s / 1e9})
        total_s += s
        total_b += b
        del w, packed
        print(f"{t.name:6} {t.num_rows:>11,} rows  {b / 1e9:7.2f} GB  {s:7.3f} s  {b / s / 1e9:7.1f} GB/s", flush=True)
    print(f"total  {total_b / 1e9:.1f} GB in {total_s:.1f} s ({total_b / total_s / 1e9:.1f} GB/s); goal: full "
          f"dlrm-mlperf starts within 30 s")
    out = Path(args.out) if args.out else ROOT / "bench" / "results" / "table_init" / f"{machine.replace(' ', '_')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"machine": machine, "device": str(dev), "model": model.name, "tables": rows,
                               "total_seconds": total_s, "total_gb": total_b / 1e9, "goal_seconds": 30.0}, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
