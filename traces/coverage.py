"""What "the top x% of IDs" means, in one place: whole IDs, ceil(x * distinct).

A fraction of an ID has no meaning to a user (the top 1% of a 24-ID field is its hottest
ID, not 0.24 of it), so every "top x% covers" that analyze, the report, the demo and the
planner show counts this many IDs.
"""

from __future__ import annotations

import math

import numpy as np

# below 1, so that log1p(-p) stays finite for an ID that is every draw
_P_MAX = 1.0 - 1e-15


def top_ids(fraction, distinct):
    """Whole IDs in the top `fraction` of `distinct` IDs: ceil(fraction * distinct), 0 for none.

    Rounds away float noise first (0.1 * 30 is 3.0000000000000004, and means 3 IDs).
    Works on scalars and arrays.
    """
    x = np.clip(np.asarray(fraction, dtype=np.float64), 0.0, 1.0)
    n = np.ceil(np.round(x * float(distinct), 9))
    return int(n) if n.ndim == 0 else n.astype(np.int64)


def presence(p, draws: float):
    """Probability that an ID drawn with probability `p` per draw appears among `draws`
    draws: 1 - (1 - p)^draws, computed stably for tiny p. Scalars and arrays."""
    q = -np.expm1(draws * np.log1p(-np.minimum(np.asarray(p, dtype=np.float64), _P_MAX)))
    return float(q) if np.ndim(q) == 0 else q


def presence_threshold(share: float, draws: float) -> float:
    """The per-draw probability whose presence over `draws` draws is `share` (presence's inverse)."""
    return -math.expm1(math.log1p(-share) / draws)
