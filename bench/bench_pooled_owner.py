"""A pooled pack's owner step: gather-then-sum and expanded gradients vs in place, same run.

The owner of a pooled pack (executor.sparse.pooled) sums the lookups it receives per (source, bag)
and, in the backward, applies each lookup its bag's gradient with row-wise Adagrad. Before,
it gathered every looked-up row (index_select), summed them per bag (index_add_), expanded
each bag's gradient to its lookups (index_select), concatenated the step's parts and ran the
sparse update. In place, the native bag_forward pools straight from the shard and
sparse_update_indexed reads each bag's gradient where it lies. Both paths get the same inputs
and must give bit-identical sums, weights and states (checked here); the ratio is the result.

Case: the multi-hot DCNv2 table C21 (pooling 100) at the owner of a 4-rank table-wise plan
with 512 samples per rank (bench/bench_pooled_gloo.py's setup): 204,800 lookups a step into
100,000 rows of dim 32, Zipf(1.05).

    python bench/bench_pooled_owner.py [--repeats 9] [-o bench/results/pooled_owner/<machine>.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from results_path import results_path  # noqa: E402

from executor.sparse import kernels as K  # noqa: E402


def make_case(rows: int, dim: int, sources: int, samples: int, pooling: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, rows + 1) ** 1.05
    bags = sources * samples
    ids = torch.from_numpy(rng.choice(rows, bags * pooling, p=p / p.sum()))
    lengths = torch.full((bags,), pooling, dtype=torch.int64)
    offsets = torch.zeros(bags + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    gen = torch.Generator().manual_seed(seed)
    return {"weight": torch.randn(rows, dim, generator=gen), "state": torch.rand(rows, generator=gen),
            "ids": ids, "lengths": lengths, "offsets": offsets,
            "bag": torch.repeat_interleave(torch.arange(bags), lengths),
            "bag_grad": torch.randn(bags, dim, generator=gen) * 1e-2}


def gathered(c: dict, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The owner step as it ran before: rows gathered, summed per bag; gradients expanded."""
    pooled = torch.zeros(len(c["lengths"]), w.shape[1]).index_add_(0, c["bag"], w.index_select(0, c["ids"]))
    g = torch.cat([c["bag_grad"].index_select(0, c["bag"])])  # the step's parts, concatenated
    K.sparse_update(w, s, torch.cat([c["ids"]]), g, "rowwise_adagrad", 0.01, 1e-8)
    return pooled


def in_place(c: dict, w: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """The owner step now (executor.sparse.pooled: owner_sums with no rows, apply_cold's indexed update)."""
    pooled = K.bag_forward(w, c["ids"], c["offsets"])
    K.sparse_update_indexed(w, s, c["ids"], c["bag_grad"], c["bag"], "rowwise_adagrad", 0.01, 1e-8)
    return pooled


def timed(fn, c: dict, repeats: int) -> float:
    w, s = c["weight"].clone(), c["state"].clone()
    fn(c, w, s)  # warm
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn(c, w, s)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("-o", "--output", default=str(results_path("pooled_owner")))
    args = ap.parse_args()
    torch.set_num_threads(1)  # one core per rank, as the 2-rank runs on this machine
    if not K.load_native():
        raise SystemExit("bench_pooled_owner: the native kernels did not load (see `picasso doctor`)")
    c = make_case(rows=100_000, dim=32, sources=4, samples=512, pooling=100)
    w1, s1, w2, s2 = c["weight"].clone(), c["state"].clone(), c["weight"].clone(), c["state"].clone()
    p1, p2 = gathered(c, w1, s1), in_place(c, w2, s2)
    same = bool(torch.equal(p1, p2) and torch.equal(w1, w2) and torch.equal(s1, s2))
    if not same:
        raise SystemExit("bench_pooled_owner: the in-place step differs from the gathered one")
    t_old, t_new = timed(gathered, c, args.repeats), timed(in_place, c, args.repeats)
    print(f"owner step, {len(c['ids']):,} lookups: gathered {t_old:.2f} ms, in place {t_new:.2f} ms "
          f"-> {t_old / t_new:.2f}x (bit-identical: {same})")
    from validation.validate import machine

    result = {"bench": "pooled_owner", "machine": {**machine(), "threads": 1},
              "lock": os.environ.get("PICASSO_BENCH_LOCK_HELD") and "alone on the machine (/work/bin/quiet-run)",
              "case": {"rows": 100_000, "dim": 32, "lookups": len(c["ids"]), "pooling": 100, "zipf": 1.05},
              "ms": {"gathered": t_old, "in_place": t_new}, "speedup": t_old / t_new, "bit_identical": same}
    Path(args.output).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
