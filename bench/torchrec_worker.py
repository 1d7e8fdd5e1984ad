"""One rank of TorchRec's side of bench_vs_torchrec.py (run by torchrun inside the TorchRec venv).

It imports nothing of picasso: the driver hands it the rows picasso's reader produced
(table rows after `% num_rows`, log1p dense features, labels) as an .npz, and the model
and optimizer settings on the command line. TorchRec's own planner (EmbeddingShardingPlanner
on a CPU topology: table-wise or data-parallel there) shards the tables; rank 0 prints one
JSON line with samples/s over the timed steps (slowest rank's clock) and the plan it chose.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch
import torch.distributed as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, help=".npz with dense [N,13], sparse [N,26] rows, labels [N]")
    ap.add_argument("--rows", required=True, help="rows per table, comma-separated")
    ap.add_argument("--dim", type=int, required=True)
    ap.add_argument("--batch", type=int, required=True, help="per rank")
    ap.add_argument("--bottom", required=True, help="bottom MLP sizes, e.g. 512,256,16")
    ap.add_argument("--top", required=True, help="top MLP sizes, e.g. 512,512,256,1")
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.models.dlrm import DLRM, DLRMTrain
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
    from torchrec.optim.optimizers import in_backward_optimizer_filter
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    torch.manual_seed(0)
    rows = [int(x) for x in args.rows.split(",")]
    feats = [f"C{i + 1}" for i in range(len(rows))]
    tables = [EmbeddingBagConfig(name=f"t_{f}", embedding_dim=args.dim, num_embeddings=n, feature_names=[f])
              for f, n in zip(feats, rows)]
    ebc = EmbeddingBagCollection(tables=tables, device=torch.device("meta"))
    model = DLRMTrain(DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=[int(x) for x in args.bottom.split(",")],
                           over_arch_layer_sizes=[int(x) for x in args.top.split(",")]))
    # embeddings: row-wise Adagrad fused into the backward (FBGEMM TBE), as picasso's rowwise_adagrad
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(), {"lr": args.lr, "eps": args.eps})
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       batch_size=args.batch, debug=False)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda p: torch.optim.Adagrad(p, lr=args.lr, eps=args.eps))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])

    d = np.load(args.data)
    dense, sparse, labels = d["dense"], d["sparse"], d["labels"]
    g = args.batch * world
    if len(labels) < g * args.steps:
        raise SystemExit(f"{args.data}: {len(labels)} rows, {g * args.steps} needed")
    batches = []  # prepared before the timed loop, as picasso run --preload does
    lengths = torch.ones(len(feats) * args.batch, dtype=torch.int32)
    for s in range(args.steps):
        lo = s * g + rank * args.batch
        sp = sparse[lo : lo + args.batch]
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=feats, values=torch.from_numpy(np.ascontiguousarray(sp.T).reshape(-1)),
                                                  lengths=lengths)
        batches.append(Batch(dense_features=torch.from_numpy(dense[lo : lo + args.batch]), sparse_features=kjt,
                             labels=torch.from_numpy(labels[lo : lo + args.batch])))
    dmp.train()
    times = []
    dist.barrier()
    for s, b in enumerate(batches):
        t = time.perf_counter()
        opt.zero_grad()
        loss, _ = dmp(b)
        loss.backward()
        opt.step()
        if s >= args.warmup:
            times.append(time.perf_counter() - t)
    total = torch.tensor([sum(times)], dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.MAX)
    if rank == 0:
        kinds = sorted({str(getattr(o, "sharding_type", "?")) for m in plan.plan.values() for o in m.values()})
        print(json.dumps({"samples_per_s": g * len(times) / float(total), "timed_steps": len(times),
                          "sharding_types": kinds, "last_loss": float(loss)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
