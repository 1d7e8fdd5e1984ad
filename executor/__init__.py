"""The torch.distributed runtime that executes a Plan, in wings.

- `sparse/`: the embedding side: `layout` (where each packed row lives, the deterministic initial
  weights), `embedding.ShardedPack` (one pack on one rank: hot cache, cold shard, the staged lookup
  and its backward/updates), the pooled exchanges, the hot-path `kernels` and the sync-free primitives.
- `dense/`: the dense archs (dlrm, deepfm, dcn, wide_deep, din) in three timed stages, the
  interaction, dense optimizers and precision.
- `data/`: global batches cut from logs or converted datasets, byte ranges of text logs.
- `process/`: `agent` (starts a node's ranks), `rendezvous` (the store, bound to --master-addr
  only), `launch`, spawning, process trees, threads and memory.
- `step/`: `trainer.Trainer` (one rank's step, which lowering mirrors) and its op `timing`.
- `run/`: `config` (the typed `RunConfig` every run setting is a field of), `worker` (one rank's run in
  phases, `python -m executor CONFIG.json`), its data `sources`, the `cuda_graph` around the
  step, `evaluate`, `reference` and `verify` (the single-process check), `checkpoint`, `memory`,
  `result` (the typed `RunResult`) and `plan_fields` (the Plan fields no run reads).
- `measure/`: the `microbench` kernels and collectives that calibration reads.
- `comm`: the collectives every wing that exchanges reads through.
"""
