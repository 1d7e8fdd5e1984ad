"""One writer at a time for a folder: an advisory lock on a file inside it (fcntl.flock).

The kernel drops the lock when its holder ends, however it ends, so a killed run leaves no
stale lock behind. A lock file inside the folder stays; one beside an output is removed by its
holder, and a process that locked a removed file locks the new one instead.
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
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FolderBusy(f"{folder}: exists and is not a folder; expected a {what}")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"{folder}: cannot write this {what} ({exc.strerror or exc})") from None
    with _locked(folder / LOCK_NAME, folder, what):
        yield folder


@contextlib.contextmanager
def one_writer_beside(target: str | os.PathLike, what: str) -> Iterator[Path]:
    """The writer lock of an output that is replaced whole by a rename (a converted dataset
    folder): its lock file sits beside it, `.NAME.picasso-writer.lock`, since one inside would
    leave with the replaced folder; it is removed when the writer ends, so nothing is left
    beside the output. The target's folder must exist."""
    target = Path(target)
    with _locked(target.parent / f".{target.name}{LOCK_NAME}", target, what, remove=True):
        yield target


@contextlib.contextmanager
def _locked(lock_file: Path, target: Path, what: str, remove: bool = False) -> Iterator[None]:
    """flock `lock_file`; with `remove` the holder deletes it before releasing, and a process
    that locked a file already deleted (its inode no longer at the path) tries again."""
    import fcntl

    while True:
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise OSError(f"{target}: cannot write this {what} ({exc.strerror or exc})") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise FolderBusy(f"{target}: another picasso process{f' (pid {holder})' if holder.isdigit() else ''} "
                             f"is writing this {what}; wait for it to end or choose another folder") from None
        if not remove or _same_file(fd, lock_file):
            break
        os.close(fd)  # the holder before us removed this file: lock the one at the path now
    try:
        with contextlib.suppress(OSError):  # the pid only names the holder to a second writer (a full disk)
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(lock_file)
        os.close(fd)  # releases the lock


def _same_file(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    fst = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (fst.st_dev, fst.st_ino)
