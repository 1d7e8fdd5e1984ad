"""The thread policy of every process that trains or measures, in one place.

OpenMP threads that spin while they wait turn a core shared with other processes into
steps 5-10x slower (measured here: 358 ms against 53 ms per step at one rank with two
threads), so ranks wait passively; and the ranks of one machine share its cores out
evenly. Measured runs (`executor.process.launch`) and the calibration microbenchmarks
(`executor.measure.microbench`) follow the same policy, so what calibration measures is what a
run meets. A user's own OMP_* settings win.
"""

from __future__ import annotations

import os

WAIT_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


def threads_per_rank(local_ranks: int) -> int:
    """Intra-op threads of one rank when `local_ranks` ranks share this machine."""
    return max(1, (os.cpu_count() or 1) // max(1, local_ranks))


def rank_env(local_ranks: int) -> dict[str, str]:
    """Environment defaults for rank processes (read by OpenMP when torch loads)."""
    return {"OMP_NUM_THREADS": str(threads_per_rank(local_ranks)), **WAIT_ENV}


def set_rank_threads(local_ranks: int, threads: int | None = None) -> int:
    """In a rank: `threads` when given, else OMP_NUM_THREADS when set, else the machine's share."""
    import torch

    env = os.environ.get("OMP_NUM_THREADS", "")
    n = threads or (int(env) if env.isdigit() and int(env) > 0 else threads_per_rank(local_ranks))
    torch.set_num_threads(n)
    return n
