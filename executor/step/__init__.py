"""One rank's training step: the `trainer` (what lowering mirrors) and its op `timing`."""
