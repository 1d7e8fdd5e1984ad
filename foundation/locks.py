"""One writer at a time for a folder: an advisory lock on a file inside it (fcntl.flock).

The kernel drops the lock when its holder ends, however it ends, so a killed run leaves no
stale lock behind. The lock file stays (removing it would let two writers lock two files).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

LOCK_NAME = ".picasso-writer.lock"


class FolderBusy(ValueError):
    """Another process writes the folder (one line, names the folder and the holder)."""


@contextlib.contextmanager
def one_writer(folder: str | os.PathLike, what: str) -> Iterator[Path]:
    """Hold `folder`'s writer lock (creating the folder) for the block; FolderBusy when
    another process holds it. `what` names the folder in the message ("checkpoint folder")."""
    import fcntl

    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FolderBusy(f"{folder}: exists and is not a folder; expected a {what}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise OSError(f"{folder}: cannot write this {what} ({exc.strerror or exc})") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            raise FolderBusy(f"{folder}: another picasso process{f' (pid {holder})' if holder.isdigit() else ''} "
                             f"is writing this {what}; wait for it to end or choose another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield folder
    finally:
        os.close(fd)  # releases the lock
