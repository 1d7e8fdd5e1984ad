"""The checks on a run's data done before any rank starts: each input is a regular file, a glob of
them or a converted folder, and its dense columns are the ones the model takes.

Done up front because a worker finds a bad input only when it reads it: a FIFO given as
--eval-data would block or fail after the whole training, a wrong dense count after the ranks start.
"""

from __future__ import annotations

import os

from planner.model_spec import ModelSpec
from traces.dataset import Dataset, expand_inputs, is_dataset

SYNTHETIC = "synthetic"  # rows generated to fit the model


def dense_columns(data: str, fmt: str, what: str) -> int | None:
    """Dense columns the workers will read from `data` (None for synthetic rows); a path that is not a
    regular file, a glob of them or a converted folder is one line naming `what`."""
    from foundation.files import regular_file
    from traces.readers import open_reader

    if data == SYNTHETIC:
        return None
    if is_dataset(data):
        return len(Dataset(data).dense_names)
    files = expand_inputs(data)
    for f in files:  # a FIFO or a device would block or never end
        if os.path.isdir(f):
            raise ValueError(f"{f}: {what} is a folder without a manifest.json, not one from `picasso convert`")
        regular_file(f, what)
    first = len(open_reader(files[0], fmt).dense_names)
    for f in files[1:]:  # each file of a glob is some rank's: its layout is checked here, not by that rank
        n = len(open_reader(f, fmt).dense_names)
        if n != first:
            raise ValueError(f"{f}: {n} dense columns, {files[0]} has {first} (the files of {data} must share "
                             "one layout)")
    return first


def check_input(model: ModelSpec, data: str, fmt: str, what: str) -> None:
    """`data` is readable as `fmt` and has exactly the model's dense columns (one line otherwise)."""
    from executor.data.batches import check_dense_count

    n = dense_columns(data, fmt, what)
    if n is not None:
        check_dense_count(model, n, what)


def check_inputs(model: ModelSpec, data: str, fmt: str, eval_data: str | None, eval_fmt: str | None) -> None:
    """A run's --data and --eval-data, before any rank starts (a FIFO as --eval-data was found only
    after the training, a wrong dense count only once the ranks read a batch)."""
    check_input(model, data, fmt, "data file")
    if eval_data is not None:
        check_input(model, eval_data, eval_fmt or fmt, "--eval-data file")
