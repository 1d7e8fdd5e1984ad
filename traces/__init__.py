"""traces: click logs in, access-frequency profiles out.

- `open_reader(path, fmt)`: streaming readers (criteo, avazu, csv, parquet, libsvm) yielding `Chunk`s;
- `profile_file(path, fmt)` -> `AccessProfile` (per-feature `FeatureProfile`), save/load, `scale_to(rows)`;
- `generate_criteo(path, rows)`: synthetic Criteo-layout logs with the Kaggle cardinalities.
How raw values become int64 IDs: traces/ids.py.
"""

from traces.errors import TraceError
from traces.profile import AccessProfile, FeatureProfile, profile_file
from traces.readers import Chunk, open_reader
from traces.synth import generate_criteo

__all__ = ["AccessProfile", "Chunk", "FeatureProfile", "TraceError", "generate_criteo", "open_reader", "profile_file"]
