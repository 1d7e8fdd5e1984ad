"""How repeatable `picasso validate` is on this machine: two sweeps of the same plans compared.

A prediction cannot be checked more finely than the measurement repeats. Given the JSON
results of two `picasso validate` runs over the same sweep (same data, plans, settings;
each with its own `picasso calibrate`), it reports per plan the two measured iterations,
the between-sweep difference, the pass-to-pass difference inside each sweep (with
`--repeats` > 1), and both sweeps' MAPE and Spearman; writes
bench/results/validate_repeatability/<machine>.json.

    python bench/validate_repeatability.py first.json second.json [-o OUT]
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from foundation.files import atomic_write_bytes  # noqa: E402


def rel_diff(a: float, b: float) -> float:
    """|a - b| over their mean."""
    return abs(a - b) / ((a + b) / 2)


def compare(first: dict, second: dict) -> dict:
    a = {r["name"]: r for r in first["per_plan"]}
    b = {r["name"]: r for r in second["per_plan"]}
    common = [n for n in a if n in b]
    if not common:
        raise SystemExit("the two results share no plan: not the same sweep")
    between = [rel_diff(a[n]["measured_us"], b[n]["measured_us"]) for n in common]
    within = [rel_diff(*r["passes_measured_us"][:2]) for res in (a, b) for r in res.values()
              if len(r.get("passes_measured_us", [])) >= 2]
    out = {
        "note": "measurement repeatability of `picasso validate` on this machine: the same plans "
                "measured by two sweeps (each after its own `picasso calibrate`); a prediction "
                "cannot be checked more finely than this",
        "plans": len(common),
        "between_sweeps": {"mean_abs_rel_diff": float(np.mean(between)),
                           "median_abs_rel_diff": float(np.median(between)),
                           "max_abs_rel_diff": float(np.max(between))},
        "sweeps": [{"mape": r["mape"], "spearman": r["spearman"], "repeats": r.get("repeats", 1),
                    "microbench_only_mape": r.get("microbench_only", {}).get("mape")} for r in (first, second)],
        "per_plan": [{"name": n, "first_us": a[n]["measured_us"], "second_us": b[n]["measured_us"],
                      "first_error": a[n]["error"], "second_error": b[n]["error"]} for n in common],
        "machine": {"processor": platform.processor() or platform.machine(), "platform": platform.platform(),
                    "python": platform.python_version()},
    }
    if within:
        out["between_passes"] = {"mean_abs_rel_diff": float(np.mean(within)),
                                 "median_abs_rel_diff": float(np.median(within)), "pairs": len(within)}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("first")
    ap.add_argument("second")
    ap.add_argument("-o", "--out", default=str(results_path("validate_repeatability")))
    args = ap.parse_args()
    res = compare(json.loads(Path(args.first).read_text()), json.loads(Path(args.second).read_text()))
    print(f"{'plan':<34} {'first ms':>9} {'second ms':>9} {'diff':>7}")
    for r in res["per_plan"]:
        print(f"{r['name']:<34} {r['first_us'] / 1e3:9.2f} {r['second_us'] / 1e3:9.2f} "
              f"{rel_diff(r['first_us'], r['second_us']):7.1%}")
    bs = res["between_sweeps"]
    print(f"between sweeps: mean {bs['mean_abs_rel_diff']:.1%}, median {bs['median_abs_rel_diff']:.1%}")
    if "between_passes" in res:
        print(f"between passes of one sweep: mean {res['between_passes']['mean_abs_rel_diff']:.1%}")
    for i, s in enumerate(res["sweeps"], 1):
        print(f"sweep {i}: MAPE {s['mape']:.1%}, Spearman {s['spearman']:.3f} ({s['repeats']} pass(es))")
    atomic_write_bytes(Path(args.out), (json.dumps(res, indent=1) + "\n").encode())
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
