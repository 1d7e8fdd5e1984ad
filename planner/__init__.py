"""planner: model specs, the Plan schema, lowering, plan search, baselines and explanations.

Public entry points (import from the modules; this package imports nothing eagerly):
- planner.presets.get_model(name_or_yaml) -> ModelSpec; ModelSpec.with_row_cap(n)
- planner.access.table_access(model, profile=None) -> {table: TableAccess}
  (measured profile, or Zipf(1.05) per table with TableSpec.pooling_factor)
- planner.lowering.lower(plan, hw, profile=None, access=None, symmetric=None,
  check_memory=True, fuse_table_wise=False) -> Lowered(graph, ops, packs, memory, dense,
  dense_dtype, notes); the dense layers' precision is model.dense_precision (a DenseDtype,
  fp32 unless asked; planner.dense.dense_dtype(model, hw) -> (dtype used, fallback note or None))
- planner.search.search(model, hw, profile=None, batch_size_per_rank=4096, *, access=None,
  time_budget_s=20, top_k=10, micro_batch_options=(1, 2, 4, 8, 16), progress=None) -> SearchResult
  (.plan, .hot_ids, .best, .candidates); planner.search.evaluate(plan, hw, access, engine)
- planner.builders: every plan built without a search: baseline_plan(name, model, world, batch,
  hw=None, access=None) for name in BASELINES = ("naive", "torchrec-like", "dp-hot-only"),
  naive_plan, the validation sweep (build_sweep -> [Case]) and random_plan (tests)
- planner.explain.explain(plan, hw, profile=None, access=None, baselines=BASELINES,
  engine="simpy", evaluation=None) -> Explanation (.to_dict(), .text(), .speedups())
"""
