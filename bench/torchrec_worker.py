"""One rank of TorchRec's side of bench_vs_torchrec.py and bench_pooled_gloo.py (run by torchrun
inside the TorchRec venv).

It imports nothing of picasso: the driver (bench/torchrec_side.py) hands it the rows
picasso's reader produced (table rows after `% num_rows`, log1p dense features, labels,
multi-hot bags with their lengths) as an .npz, and the model and optimizer settings on the
command line: DLRM (dot interaction), or with --cross-rank DLRM-DCNv2 (TorchRec's DLRM_DCN:
a low-rank cross network over [bottom output, pooled embeddings], as picasso's DCN). TorchRec's own planner (EmbeddingShardingPlanner
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
    ap.add_argument("--lr", type=float, default=0.01, help="embeddings' learning rate")
    ap.add_argument("--dense-lr", type=float, help="dense layers' learning rate (default: --lr)")
    ap.add_argument("--sparse-optimizer", choices=("rowwise_adagrad", "adagrad", "sgd"), default="rowwise_adagrad")
    ap.add_argument("--cross-layers", type=int, default=0)
    ap.add_argument("--cross-rank", type=int, default=0, help="> 0: DLRM-DCNv2 with this low rank")
    ap.add_argument("--eps", type=float, default=1e-8)
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--warmup", type=int, default=2)
    args = ap.parse_args()

    from torchrec import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
    from torchrec.datasets.utils import Batch
    from torchrec.distributed import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, Topology
    from torchrec.distributed.sharding_plan import get_default_sharders
    from torchrec.models.dlrm import DLRM, DLRM_DCN, DLRMTrain
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
    bottom, top = [int(x) for x in args.bottom.split(",")], [int(x) for x in args.top.split(",")]
    if args.cross_rank > 0:
        model = DLRMTrain(DLRM_DCN(ebc, dense_in_features=13, dense_arch_layer_sizes=bottom, over_arch_layer_sizes=top,
                                   dcn_num_layers=args.cross_layers, dcn_low_rank_dim=args.cross_rank))
    else:
        model = DLRMTrain(DLRM(ebc, dense_in_features=13, dense_arch_layer_sizes=bottom, over_arch_layer_sizes=top))
    # embeddings: the optimizer fused into the backward (FBGEMM TBE), as picasso's sparse optimizer
    sparse_opt, sparse_kw = {"rowwise_adagrad": (RowWiseAdagrad, {"eps": args.eps}),
                             "adagrad": (torch.optim.Adagrad, {"eps": args.eps}),
                             "sgd": (torch.optim.SGD, {})}[args.sparse_optimizer]
    apply_optimizer_in_backward(sparse_opt, model.model.sparse_arch.parameters(), {"lr": args.lr, **sparse_kw})
    dense_lr = args.dense_lr if args.dense_lr is not None else args.lr
    sharders = get_default_sharders()
    planner = EmbeddingShardingPlanner(topology=Topology(world_size=world, compute_device="cpu"),
                                       batch_size=args.batch, debug=False)
    plan = planner.collective_plan(model, sharders, dist.GroupMember.WORLD)
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=plan, sharders=sharders)
    dense_opt = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                      lambda p: torch.optim.Adagrad(p, lr=dense_lr, eps=args.eps))
    opt = CombinedOptimizer([dmp.fused_optimizer, dense_opt])

    d = np.load(args.data)
    dense, labels = d["dense"], d["labels"]
    if "lengths" in d:  # bags: per table its IDs in row order, and every row's bag lengths
        lengths_all = d["lengths"].astype(np.int64)
        values = [d[f"v{i}"] for i in range(len(feats))]
    else:  # one ID per feature (the older one-hot file)
        lengths_all = np.ones(d["sparse"].shape, dtype=np.int64)
        values = [np.ascontiguousarray(d["sparse"][:, i]) for i in range(len(feats))]
    starts = [np.concatenate([[0], np.cumsum(lengths_all[:, i])]) for i in range(len(feats))]
    g = args.batch * world
    if len(labels) < g * args.steps:
        raise SystemExit(f"{args.data}: {len(labels)} rows, {g * args.steps} needed")
    batches = []  # prepared before the timed loop, as picasso run --preload does
    for s in range(args.steps):
        lo, hi = s * g + rank * args.batch, s * g + (rank + 1) * args.batch
        vals = np.concatenate([values[i][starts[i][lo]:starts[i][hi]] for i in range(len(feats))])
        lens = np.ascontiguousarray(lengths_all[lo:hi].T).reshape(-1)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=feats, values=torch.from_numpy(vals.astype(np.int64)),
                                                  lengths=torch.from_numpy(lens.astype(np.int32)))
        batches.append(Batch(dense_features=torch.from_numpy(dense[lo:hi]), sparse_features=kjt,
                             labels=torch.from_numpy(labels[lo:hi])))
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
