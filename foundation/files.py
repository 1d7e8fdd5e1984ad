"""Atomic file writes with one file mode, and the checks on what may be overwritten.

A write goes to a temp file in the target's folder, is fsynced, renamed over the target,
and the folder is fsynced: a crash or a full disk leaves the old file or the new one,
never half of one. A target that exists and is not a regular file (a device, a FIFO, a
socket, a folder) is refused: renaming over `/dev/full` would replace the device.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

FILE_MODE = 0o644  # every file picasso writes: readable by all, writable by the owner


class UnwritableTarget(OSError):
    """The output path cannot be written as a regular file (one line, names the path)."""


def check_output_path(path: str | os.PathLike) -> Path:
    """`path` as a Path if it may be (over)written as a regular file; else UnwritableTarget."""
    path = Path(path)
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        check_creatable(path)
        return path
    except OSError as exc:
        raise UnwritableTarget(f"{path}: cannot write here ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise UnwritableTarget(f"{path}: is a folder, expected a file name")
    if not stat.S_ISREG(st.st_mode):
        raise UnwritableTarget(f"{path}: exists and is not a regular file (a device, FIFO or socket); refusing to replace it")
    return path


def check_creatable(path: str | os.PathLike) -> None:
    """The one rule for an output whose folders are missing, for every command: they are created
    when it is written, so the nearest existing folder above it must be a folder this process may
    write; checked before any work, and nothing is created until the output is written."""
    above = Path(os.path.abspath(path)).parent
    while not os.path.lexists(above):
        above = above.parent
    if not above.is_dir():
        raise UnwritableTarget(f"{path}: {above} is not a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise UnwritableTarget(f"{path}: folder {above} is not writable")


@contextlib.contextmanager
def folders_for(path: str | os.PathLike) -> Iterator[None]:
    """The missing folders above `path`, created for the block's work and removed again (when
    still empty) if it fails: a refused command leaves no folder behind."""
    made: list[Path] = []
    above = Path(os.path.abspath(path)).parent
    while not os.path.lexists(above):
        made.append(above)
        above = above.parent
    try:
        for folder in reversed(made):
            folder.mkdir()
        yield
    except BaseException:
        for folder in made:  # deepest first
            try:
                folder.rmdir()
            except OSError:
                break
        raise


def fsync_dir(folder: str | os.PathLike) -> None:
    """Make a rename inside `folder` durable (no-op where folders cannot be opened)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(path: str | os.PathLike, write: Callable[[BinaryIO], object]) -> None:
    """Call write(f) on a temp file beside `path`, fsync, rename over `path`, fsync the folder.

    Write errors (ENOSPC, EIO, ...) raise OSError naming `path`; the temp file is removed
    and an existing `path` is left as it was.
    """
    path = check_output_path(path)
    folder = path.parent
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise write_error(path, exc) from None
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)  # may close f (a compressing stream closes what it wraps)
        _fsync_file(tmp)
        os.chmod(tmp, FILE_MODE)
        check_output_path(path)  # the target may have become a device meanwhile
        os.replace(tmp, path)
    except BaseException as exc:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, UnwritableTarget):
            raise write_error(path, exc) from None
        raise
    fsync_dir(folder)


def _fsync_file(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_error(path: Path, exc: OSError) -> OSError:
    """One line naming the file, keeping errno (ENOSPC, EACCES, ...) for callers that test it."""
    err = OSError(f"{path}: cannot write ({exc.strerror or exc})")
    err.errno = exc.errno
    return err


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write `data` to `path` atomically (see atomic_write)."""
    atomic_write(path, lambda f: f.write(data))


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write `text` as UTF-8 to `path` atomically (see atomic_write)."""
    atomic_write_bytes(path, text.encode("utf-8"))


def regular_file(path: str | os.PathLike, what: str) -> Path:
    """`path` if it is an existing regular file; a FIFO or device would block or never end."""
    path = Path(path)
    try:
        st = path.stat()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such {what}") from None
    except OSError as exc:
        raise OSError(f"{path}: cannot read {what} ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path}: {what} is {file_kind(st.st_mode)}, not a regular file")
    return path


def file_kind(mode: int) -> str:
    """What a path that is not a regular file is, as a message says it: a pipe never ends or
    blocks, a device such as /dev/zero is endless."""
    if stat.S_ISFIFO(mode):
        return "a pipe (its bytes can be read once, and it may never end)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device (endless, or not a file's bytes)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISDIR(mode):
        return "a folder"
    return "not a file"
