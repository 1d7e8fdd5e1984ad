"""A process's one-line reports written whole, in one write.

The ranks of a run and their agent share one log file. Under `python -u` (how the agent starts
ranks) `print` writes a line's text and its newline in two writes, so two ranks failing at once
could glue their lines into one ("...error: Aexecutor rank 1: error: B"); one write of the whole
line cannot be cut by another process's write to the same file.
"""

from __future__ import annotations

import os
import sys


def say(line: str) -> None:
    """Write `line` and its newline to stderr in one write (after whatever stderr holds)."""
    sys.stderr.flush()
    text = line.rstrip("\n") + "\n"
    try:
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):  # a stream without a descriptor (a test's capture): one write call
        sys.stderr.write(text)
        sys.stderr.flush()
        return
    data = text.encode("utf-8", "replace")
    while data:
        data = data[os.write(fd, data):]
