"""Measurements of this machine that calibration reads: the `microbench` kernels and collectives."""
