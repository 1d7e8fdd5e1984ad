"""One run of a Plan: a rank's run (`worker`), its settings (`args`), the CUDA graph around the step,
evaluation, the single-process `reference` and `verify`, checkpoints, memory estimates and the
typed `RunResult`."""
