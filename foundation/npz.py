"""Reading an .npz someone else wrote (a profile's arrays, a plan's hot IDs): arrays of numbers only,
and no more memory than the file's own bytes justify.

numpy's loader trusts the archive: a member's header may promise 2^40 elements (allocated before a
byte is read), and a deflated member of a few MB may inflate to gigabytes. Here each member's
header must describe exactly the bytes the member holds, and the members together may inflate to
at most MAX_INFLATION times the file's size (np.savez stores them uncompressed: 1x).
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path

import numpy as np

MAX_INFLATION = 16  # np.savez_compressed of real ID and count arrays gains a few times at most
MAX_HEADER_BYTES = 1 << 16  # an .npy header is a short dict literal


class NpzError(ValueError):
    """An archive that is not arrays of numbers of a bounded size; str() names the file."""


class BoundedNpz:
    """The arrays of an .npz by name (`files`, `z[name]`), each read only when asked for."""

    def __init__(self, path: str | os.PathLike, what: str) -> None:
        self.path, self.what = Path(path), what
        try:
            self.zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile, ValueError) as exc:
            raise NpzError(f"{self.path}: {what} is not an .npz archive ({_first_line(exc)})") from None
        infos = [i for i in self.zip.infolist() if not i.is_dir()]
        inflated = sum(i.file_size for i in infos)
        budget = MAX_INFLATION * max(self.path.stat().st_size, 1 << 20)
        if inflated > budget:
            self.zip.close()
            raise NpzError(f"{self.path}: {what} would inflate to {inflated:,} bytes from {self.path.stat().st_size:,}, "
                           "more than real arrays compress")
        self._members = {i.filename.removesuffix(".npy"): i for i in infos}
        self.files = list(self._members)

    def __getitem__(self, name: str) -> np.ndarray:
        info = self._members.get(name)
        if info is None:
            raise KeyError(name)
        where = f"{self.path}: {self.what} member {info.filename}"
        try:
            with self.zip.open(info) as f:
                shape, fortran, dtype = _header(f, where)
                count = 1
                for n in shape:
                    count *= n  # Python ints: a hostile shape cannot wrap around
                nbytes = count * dtype.itemsize
                if f.tell() + nbytes != info.file_size:
                    raise NpzError(f"{where}: its header promises {nbytes:,} bytes of data, it holds "
                                   f"{info.file_size - f.tell():,}")
                buf = bytearray(nbytes)
                if f.readinto(buf) != nbytes:
                    raise NpzError(f"{where}: truncated")
        except (OSError, zipfile.BadZipFile, EOFError) as exc:
            raise NpzError(f"{where}: damaged ({_first_line(exc)})") from None
        return np.frombuffer(buf, dtype=dtype).reshape(shape, order="F" if fortran else "C")

    def close(self) -> None:
        self.zip.close()

    def __enter__(self) -> BoundedNpz:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _header(f, where: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    """(shape, Fortran order, dtype) of an .npy stream; numbers only (no object arrays, no pickles)."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        read = {(1, 0): fmt.read_array_header_1_0, (2, 0): fmt.read_array_header_2_0}.get(version)
        if read is None:
            raise ValueError(f"format version {version}")
        shape, fortran, dtype = read(f, max_header_size=MAX_HEADER_BYTES)
    except (ValueError, SyntaxError, EOFError) as exc:
        raise NpzError(f"{where}: not a .npy array ({_first_line(exc)})") from None
    if dtype.hasobject or dtype.kind not in "biuf":
        raise NpzError(f"{where}: holds {dtype} values, expected numbers")
    return tuple(int(n) for n in shape), bool(fortran), dtype


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
