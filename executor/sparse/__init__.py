"""The embedding side of a step: packs, their exchanges, the hot-path kernels and the sync-free primitives."""
