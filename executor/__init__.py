"""The torch.distributed runtime that executes a Plan, in four wings and the run itself.

- `sparse/`: the embedding side: `layout` (where each packed row lives, the deterministic initial
  weights), `embedding.ShardedPack` (one pack on one rank: hot cache, cold shard, the staged lookup
  and its backward/updates), the pooled exchanges, the hot-path `kernels` and the sync-free primitives.
- `dense/`: the dense archs (dlrm, deepfm, dcn, wide_deep, din) in three timed stages, the
  interaction, dense optimizers and precision.
- `data/`: global batches cut from logs or converted datasets, byte ranges of text logs.
- `process/`: `agent` (starts a node's ranks), `rendezvous` (the store, bound to --master-addr
  only), `launch`, spawning, process trees, threads and memory.
- The run: `trainer.Trainer` (one rank's step), `worker` (`python -m executor`), `reference` and
  `verify` (the single-process check), `checkpoint`, `timing`, `result`.
"""
