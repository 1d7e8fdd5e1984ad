"""The torch.distributed runtime that executes a Plan.

- `layout`: where each packed row lives (cyclic row-wise, table-wise, column-wise,
  replicated) and the deterministic initial weights every rank and the reference share.
- `embedding.ShardedPack`: one pack on one rank: hot cache, cold shard, the staged lookup
  (dedup, route, all_to_all_single of IDs and rows, pool) and its backward/updates.
- `dense`: the dense archs (dlrm, deepfm, dcn, wide_deep, din) in three timed stages.
- `trainer.Trainer`: one rank's step (micro-batches, async collectives, updates).
- `reference.Reference`: the single-process nn.EmbeddingBag reference; `verify`: the check.
- `checkpoint`: save/load with manifest, resharding on load.
- `worker` (`python -m executor`), `agent` (starts a node's ranks), `rendezvous` (the store, bound
  to --master-addr only) and `launch` behind `picasso run`.
- `kernels`: the hot-path functions (pure PyTorch reference, native versions from csrc).
"""
