"""Simulator speed: ops/s of the simpy engine and the fast evaluator on a 20k-op graph, their
ratio, and the time to simulate one iteration at 8, 128 and 1,024 GPUs (symmetric graphs).

Goals: simpy >= 30k ops/s, fast >= 150k ops/s, fast/simpy >= 5x.
Writes bench/results/simulator/<machine>.json. Usage: python bench/bench_simulator.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from foundation.files import atomic_write_text  # noqa: E402
from simulator import load_hardware, simulate  # noqa: E402
from simulator.synthetic import layered_graph  # noqa: E402


def timed(fn) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of one call."""
    w, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - w, time.process_time() - c


def best_of(fn, repeat: int) -> float:
    return min(timed(fn)[0] for _ in range(repeat))


def run_engine(graph, hw, engine: str, cached: bool) -> None:
    if not cached:
        graph._cache.clear()  # include compiling the graph into arrays
    simulate(graph, hw, engine)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repeats")
    ap.add_argument("-o", default=str(results_path("simulator")))
    args = ap.parse_args()
    rep = 2 if args.quick else 4
    base = load_hardware("dgx-a100")
    layers, mbs = 25, 25  # 4 ops per (layer, micro-batch) per rank + 1: 20,008 ops at 8 ranks

    hw8 = load_hardware("dgx-a100", {"nodes": 1})
    rows = []
    ratios = {}
    agreement = {}
    goals_met = {}
    # Two 20k-op graphs: "plain" (few flows overlap) and "interleave" (gathers of one micro-batch
    # share HBM and PCIe with other micro-batches' ops: fair sharing does real work).
    for gname, il in (("plain", False), ("interleave", True)):
        g8 = layered_graph(8, layers=layers, micro_batches=mbs, interleave=il)
        n = len(g8)
        # The machine is shared: the engines' runs are interleaved and the best of several is kept,
        # in wall time and in CPU time of this process (less sensitive to other jobs).
        variants = [(e, c) for e in ("simpy", "fast") for c in (False, True)]
        wall = {v: [] for v in variants}
        cpu = {v: [] for v in variants}
        for i in range(rep * 2):
            for engine, cached in variants:
                if engine == "simpy" and i >= rep:
                    continue  # fewer repeats of the slow engine
                w, c = timed(lambda g=g8, e=engine, k=cached: run_engine(g, hw8, e, k))
                wall[(engine, cached)].append(w)
                cpu[(engine, cached)].append(c)
        best = {v: min(cpu[v]) for v in variants}
        for v in variants:
            rows.append({"graph": gname, "engine": v[0], "compiled_graph_cached": v[1], "ops": n,
                         "cpu_seconds": best[v], "wall_seconds": min(wall[v]), "ops_per_cpu_s": n / best[v],
                         "ops_per_wall_s": n / min(wall[v]), "repeats": len(cpu[v])})
        ratios[gname] = {"end_to_end": best[("simpy", False)] / best[("fast", False)],
                         "compiled_graph_cached": best[("simpy", True)] / best[("fast", True)]}
        it_s = simulate(g8, hw8, "simpy").iteration_us
        it_f = simulate(g8, hw8, "fast").iteration_us
        agreement[gname] = {"simpy_iteration_us": it_s, "fast_iteration_us": it_f, "rel_diff": abs(it_f - it_s) / it_s}
        goals_met[gname] = {"simpy": n / best[("simpy", False)] >= 30_000, "fast": n / best[("fast", False)] >= 150_000,
                            "ratio": ratios[gname]["end_to_end"] >= 5.0}

    scale = []
    for gpus in (8, 128, 1024):
        hw = load_hardware("dgx-a100", {"nodes": gpus // base.gpus_per_node})
        g = layered_graph(gpus, layers=layers, micro_batches=mbs, symmetric=True)
        for engine in ("fast", "simpy"):
            t = best_of(lambda g=g, hw=hw, e=engine: run_engine(g, hw, e, False), max(1, rep // 2))
            r = simulate(g, hw, engine)
            scale.append({"gpus": gpus, "engine": engine, "graph": "symmetric", "ops": len(g), "seconds": t,
                          "iteration_us": r.iteration_us})
    g128 = layered_graph(128, layers=layers, micro_batches=mbs)  # every rank: 320k ops, fast engine only
    hw128 = load_hardware("dgx-a100", {"nodes": 16})
    t = best_of(lambda: run_engine(g128, hw128, "fast", False), 1)
    scale.append({"gpus": 128, "engine": "fast", "graph": "full", "ops": len(g128), "seconds": t,
                  "iteration_us": simulate(g128, hw128, "fast").iteration_us})

    print(f"{'graph':10} {'engine':6} {'cached':7} {'ops':>6} {'cpu s':>8} {'ops/cpu s':>10} {'wall s':>8} {'ops/wall s':>10}")
    for r in rows:
        print(f"{r['graph']:10} {r['engine']:6} {str(r['compiled_graph_cached']):7} {r['ops']:6d} {r['cpu_seconds']:8.4f} "
              f"{r['ops_per_cpu_s']:10.0f} {r['wall_seconds']:8.4f} {r['ops_per_wall_s']:10.0f}")
    for gname, r in ratios.items():
        a = agreement[gname]
        print(f"{gname}: fast/simpy speed {r['end_to_end']:.1f}x end to end, {r['compiled_graph_cached']:.1f}x with the "
              f"compiled graph cached; iteration simpy {a['simpy_iteration_us']:.1f} us, fast {a['fast_iteration_us']:.1f} us "
              f"({a['rel_diff']:.2%})")
    print(f"{'gpus':>5} {'engine':6} {'graph':9} {'ops':>7} {'seconds':>9} {'iteration_us':>13}")
    for r in scale:
        print(f"{r['gpus']:5d} {r['engine']:6} {r['graph']:9} {r['ops']:7d} {r['seconds']:9.4f} {r['iteration_us']:13.1f}")

    try:
        torch_version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch_version = None
    out = {
        "machine": {"processor": platform.processor(), "platform": platform.platform(), "cpu_count": os.cpu_count(),
                    "python": platform.python_version(), "torch": torch_version,
                    "loadavg_1m_at_end": os.getloadavg()[0]},
        "graphs": {"kind": "simulator.synthetic.layered_graph", "layers": layers, "micro_batches": mbs, "ranks": 8,
                   "variants": ["plain", "interleave"], "hardware": "dgx-a100"},
        "throughput": rows,
        "ratio_fast_over_simpy": ratios,
        "agreement": agreement,
        "timing": "best of interleaved repeats; goals judged on CPU time of this process (shared machine)",
        "end_to_end": "the graph's compiled-form cache is cleared before every such run, so both engines compile "
                      "the graph (numpy arrays) and cost it on the hardware inside the timed call",
        "goals": {"simpy_ops_per_s": 30_000, "fast_ops_per_s": 150_000, "ratio": 5.0, "met": goals_met},
        "scaling": scale,
    }
    atomic_write_text(args.o, json.dumps(out, indent=1))
    print(f"wrote {args.o}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
