"""One owner of what a command writes: every output declared, and checked, before any work.

A command names what it reads (`read`), each file it writes (`file`) and each folder it
writes into (`folder`, with the names it writes there), then calls `check()`:

- no output is an input or another output: the same path, a symlink to it, or a hard link
  (the same device and inode);
- an output folder neither holds an input nor lies inside an input folder, and nothing
  else the command writes or reads lies inside it, unless the folder says it may (a file
  beside the folder's own names; a checkpoint a run resumes from and saves to);
- no output replaces a file that an input folder already holds (a dataset's shard, a
  sweep's results);
- an output folder that exists is empty or of picasso's own kind: it holds the marker
  `.picasso-folder` naming that kind (`claim` writes it when the command first writes
  there), or passes the kind's own test (a folder picasso wrote before markers existed).

Nothing is created by `check()`: a command refused there leaves no folder behind, and one
that fails inside `claimed()` takes away the folder it created if nothing was written there.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from foundation.documents import read_json
from foundation.files import atomic_write_text, check_creatable, check_output_path
from foundation.locks import LOCK_NAME

MARKER = ".picasso-folder"
_OWN = (MARKER, LOCK_NAME)  # names picasso keeps in any folder it writes


class OutputClash(ValueError):
    """Two paths of one command that must be distinct are not (one line, names both flags)."""


def _identity(path: Path) -> tuple:
    """What makes two names one file: the device and inode of what exists, else the path a new
    file would get (symlinks and `..` resolved)."""
    try:
        st = os.stat(path)
        return ("inode", st.st_dev, st.st_ino)
    except OSError:
        return ("path", os.path.realpath(path))


def _lineage(path: Path) -> list[tuple]:
    """The identities of `path` and of every folder above it: a folder holds `path` when its
    identity is among them (a bind mount or a symlinked folder included)."""
    real = Path(os.path.realpath(path))
    out = [_identity(real)]
    for up in real.parents:
        out.append(_identity(up))
    return out


@dataclass
class _Folder:
    flag: str
    path: Path
    kind: str
    names: tuple[str, ...]  # patterns of the names it writes directly inside; ("*",): all of it
    legacy: Callable[[Path], bool] | None
    inputs_inside: tuple[str, ...]  # input flags that may lie inside it (a resume from the same folder)
    replaced: bool  # written elsewhere and renamed over the path: its contents are never written in place

    def owns(self, rel: Path) -> bool:
        first = rel.parts[0] if rel.parts else ""
        return any(fnmatch.fnmatchcase(first, p) for p in self.names + _OWN)


@dataclass
class Outputs:
    """The outputs of one command; `check()` before any work, `claim(flag)` before writing a folder."""

    inputs: list[tuple[str, Path]] = field(default_factory=list)
    files: list[tuple[str, Path]] = field(default_factory=list)
    folders: list[_Folder] = field(default_factory=list)
    _missing: dict[str, bool] = field(default_factory=dict)  # output folders absent at check()

    def read(self, flag: str, paths: object, beside: tuple[str, ...] = ()) -> Outputs:
        """An input (a file or a folder; a list of them; None or "" is skipped); `beside`, the
        suffixes of files read with it (a plan's ".hot.npz")."""
        self.inputs.extend(_with_companions(flag, _paths(paths), beside))
        return self

    def file(self, flag: str, path: object, beside: tuple[str, ...] = ()) -> Outputs:
        """A file the command writes (None or "" is skipped); `beside`, the suffixes of files
        written with it (a profile's ".npz")."""
        self.files.extend(_with_companions(flag, _paths(path), beside))
        return self

    def folder(self, flag: str, path: object, kind: str, names: Iterable[str] = ("*",),
               legacy: Callable[[Path], bool] | None = None, inputs_inside: Iterable[str] = (),
               replaced: bool = False) -> Outputs:
        """A folder the command writes into: `kind` names it in its marker, `names` are the
        patterns it writes directly inside (other outputs may sit beside them)."""
        for p in _paths(path):
            self.folders.append(_Folder(flag, p, kind, tuple(names), legacy, tuple(inputs_inside), replaced))
        return self

    def check(self) -> None:
        """Refuse (OutputClash, one line) before any work; creates nothing."""
        for _, p in self.files:
            check_output_path(p)
        seen: dict[tuple, tuple[str, Path, str]] = {}
        for flag, p in self.inputs:
            ident = _identity(p)
            if ident[0] == "inode":
                seen.setdefault(ident, (flag, p, "input"))
        for flag, p in self.files + [(f.flag, f.path) for f in self.folders]:
            ident = _identity(p)
            if ident in seen:
                other, q, what = seen[ident]
                if not any(f.flag == flag and other in f.inputs_inside for f in self.folders):
                    raise OutputClash(f"{p}: {flag} would write over the {what} {other} ({q}); "
                                      f"give {flag} another path")
            seen[ident] = (flag, p, "output")
        for f in self.folders:
            self._check_containment(f)
        self._check_inside_inputs()
        for f in self.folders:
            _check_folder(f)
            self._missing[f.flag] = not os.path.lexists(f.path)

    def _check_inside_inputs(self) -> None:
        """A file an input folder already holds is part of that input (a dataset's shard, a sweep's
        results): no output replaces it."""
        folders = [(flag, p, _identity(p)) for flag, p in self.inputs if os.path.isdir(p)]
        for flag, p in self.files:
            if not os.path.lexists(p) or not folders:
                continue
            above = _lineage(p)[1:]
            for other, q, ident in folders:
                if ident in above:
                    raise OutputClash(f"{p}: {flag} would write over a file inside the input {other} ({q}); "
                                      f"give {flag} another path")

    def _check_containment(self, f: _Folder) -> None:
        top = _identity(f.path)
        for flag, p in self.inputs:
            if flag in f.inputs_inside or not os.path.lexists(p):  # a preset's name, not a path
                continue
            if top in _lineage(p):
                raise OutputClash(f"{f.path}: {f.flag} would write into the folder holding the input {flag} ({p}); "
                                  f"give {f.flag} another folder")
            if _identity(p) in _lineage(f.path)[1:]:
                raise OutputClash(f"{f.path}: {f.flag} lies inside the input {flag} ({p}); "
                                  f"give {f.flag} a folder outside it")
        for g in self.folders:
            if g is not f and top in _lineage(g.path)[1:]:
                raise OutputClash(f"{g.path}: {g.flag} lies inside the folder {f.flag} writes ({f.path}); "
                                  "give it a folder of its own")
        real_top = Path(os.path.realpath(f.path))
        for flag, p in self.files:
            if top not in _lineage(p)[1:]:
                continue
            rel = Path(os.path.realpath(p)).relative_to(real_top) if _is_below(p, real_top) else Path()
            if f.replaced or f.owns(rel):
                raise OutputClash(f"{p}: {flag} would write among the files {f.flag} writes in {f.path}; "
                                  f"give {flag} a path outside that folder")

    def claim(self, flag: str) -> Path | None:
        """Create the folder `flag` names (when missing) and mark it as picasso's own kind; None
        when the command was not given that flag. Call it when the command starts writing there."""
        for f in self.folders:
            if f.flag == flag:
                return mark(f.path, f.kind)
        return None

    @contextlib.contextmanager
    def claimed(self, flag: str | None) -> Iterator[Path | None]:
        """`claim(flag)` for the block; a folder the block leaves as new as it found it (missing at
        `check()`, now holding only picasso's marker and lock) is removed again, so a command
        that fails leaves no folder behind."""
        folder = self.claim(flag) if flag is not None else None
        try:
            yield folder
        finally:
            if folder is not None and self._missing.get(flag):
                with contextlib.suppress(OSError):
                    if set(os.listdir(folder)) <= set(_OWN):
                        for name in _OWN:
                            with contextlib.suppress(FileNotFoundError):
                                os.unlink(folder / name)
                        os.rmdir(folder)


def mark(folder: str | os.PathLike, kind: str) -> Path:
    """Create `folder` (when missing) and mark it as a picasso folder of `kind`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if folder_kind(folder) != kind:
        atomic_write_text(folder / MARKER, f"picasso {kind} folder\n")
    return folder


def holds_document(folder: Path, name: str, what: str, fits: Callable[[dict], bool]) -> bool:
    """Whether `folder/name` is a JSON object `fits` accepts: how a command recognises a folder it
    wrote before folders carried a marker (a checkpoint's manifest, a sweep's results)."""
    try:
        doc = read_json(folder / name, what, 64 << 20)
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and bool(fits(doc))


def _is_below(p: Path, top: Path) -> bool:
    try:
        Path(os.path.realpath(p)).relative_to(top)
        return True
    except ValueError:
        return False


def _with_companions(flag: str, paths: list[Path], suffixes: tuple[str, ...]) -> list[tuple[str, Path]]:
    return [(flag, p) for p in paths] + [(f"{flag}'s {s} file", p.with_suffix(s)) for p in paths for s in suffixes]


def _paths(value: object) -> list[Path]:
    items = value if isinstance(value, (list, tuple)) else [value]
    return [Path(str(p)) for p in items if p is not None and str(p) != ""]


def folder_kind(path: Path) -> str | None:
    """The kind a folder's marker names ("checkpoint"), else None."""
    try:
        with open(path / MARKER, "rb") as fh:
            text = fh.read(256).decode("utf-8", "replace").strip()
    except OSError:
        return None
    parts = text.split()
    return parts[1] if len(parts) == 3 and parts[0] == "picasso" and parts[2] == "folder" else None


def _check_folder(f: _Folder) -> None:
    """An output folder: creatable, or an existing folder that is empty or of this kind."""
    p = f.path
    if not os.path.lexists(p):
        check_creatable(p)
        return
    if f.replaced:  # its command checks what it may replace (a --force conversion)
        return
    if not p.is_dir():
        raise OutputClash(f"{p}: {f.flag} names a folder to write, and this exists and is not a folder")
    try:
        names = [n for n in os.listdir(p) if n not in _OWN]
    except OSError as exc:
        raise OutputClash(f"{p}: {f.flag}: cannot read this folder ({exc.strerror})") from None
    if not names:
        return
    kind = folder_kind(p)
    if kind == f.kind or (kind is None and f.legacy is not None and f.legacy(p)):
        return
    what = f"a picasso {kind} folder" if kind else f"not a picasso {f.kind} folder (it holds {sorted(names)[0]!r})"
    raise OutputClash(f"{p}: {f.flag} wants an empty folder or a picasso {f.kind} folder; this one is {what}; "
                      f"give {f.flag} another folder")
