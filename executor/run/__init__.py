"""One run of a Plan: its settings (`config.RunConfig`), a rank's run in phases (`worker`), its data
`sources`, the result built from the ranks' reports (`result_build`), the CUDA graph around the step,
evaluation, the single-process `reference` and `verify`, checkpoints, memory estimates and the
typed `RunResult`."""
