"""Input: global batches cut from logs or converted datasets, and per-rank byte ranges of text logs."""
