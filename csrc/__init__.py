"""Native kernels of the embedding hot path (C++/OpenMP on CPU, CUDA on GPU); see build.py."""
