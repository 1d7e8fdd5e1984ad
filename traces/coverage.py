"""What "the top x% of IDs" means, in one place: whole IDs, ceil(x * distinct).

A fraction of an ID has no meaning to a user (the top 1% of a 24-ID field is its hottest
ID, not 0.24 of it), so every "top x% covers" that analyze, the report, the demo and the
planner show counts this many IDs.
"""

from __future__ import annotations

import numpy as np


def top_ids(fraction, distinct):
    """Whole IDs in the top `fraction` of `distinct` IDs: ceil(fraction * distinct), 0 for none.

    Rounds away float noise first (0.1 * 30 is 3.0000000000000004, and means 3 IDs).
    Works on scalars and arrays.
    """
    x = np.clip(np.asarray(fraction, dtype=np.float64), 0.0, 1.0)
    n = np.ceil(np.round(x * float(distinct), 9))
    return int(n) if n.ndim == 0 else n.astype(np.int64)
