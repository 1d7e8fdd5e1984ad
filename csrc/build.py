"""Build (once, cached) and load the native kernels with torch.utils.cpp_extension + ninja.

The library holds the CPU kernels and builds where a C++ compiler exists, with or without a
GPU (the GPU's embedding kernels are Triton, in executor/sparse). Builds are cached under
csrc/_build (gitignored; ~/.cache/picasso/native where csrc/ is read-only) or
$PICASSO_NATIVE_BUILD_DIR, one directory per torch and Python version; ninja only recompiles
changed sources.
`python -m csrc.build [-v]` builds and prints what it did.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

from foundation.progress import activity

SRC_DIR = Path(__file__).resolve().parent
CPU_SOURCES = ("kernels_cpu.cpp", "interaction_cpu.cpp", "binding.cpp")
HEADERS = ("kernels.h", "binding.h")

_lock = threading.Lock()
_module: ModuleType | None = None
build_seconds: float | None = None  # wall time of the last load() that did the work (build or cache hit)


class NativeBuildError(RuntimeError):
    """The native library could not be compiled or imported."""


def build_dir() -> Path:
    import torch

    tag = f"torch{torch.__version__.split('+')[0]}-cpu-py{sys.version_info.major}{sys.version_info.minor}"
    if os.environ.get("PICASSO_NATIVE_BUILD_DIR"):
        root = Path(os.environ["PICASSO_NATIVE_BUILD_DIR"])
    elif os.access(SRC_DIR, os.W_OK):
        root = SRC_DIR / "_build"
    else:  # installed read-only: the user cache
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "picasso" / "native"
    return root / tag


def load(verbose: bool = False) -> ModuleType:
    """The compiled extension module (built on first use, then cached); raises NativeBuildError."""
    global _module, build_seconds
    with _lock:
        if _module is not None:
            return _module
        started = time.perf_counter()
        try:
            from torch.utils import cpp_extension
        except ImportError as exc:  # pragma: no cover - torch is a dependency
            raise NativeBuildError(f"torch.utils.cpp_extension unavailable: {exc}") from exc
        directory = build_dir()
        directory.mkdir(parents=True, exist_ok=True)
        # a first build takes about 40 s on two cores: say so rather than stall in silence
        built = any(directory.glob("picasso_native*.so"))
        label = "loading the native C++ kernels" if built else "building the native C++ kernels (first use, ~40 s)"
        try:
            with _build_lock(directory), activity(label):
                module = cpp_extension.load(
                    name="picasso_native",
                    sources=[str(SRC_DIR / s) for s in CPU_SOURCES],
                    extra_include_paths=[str(SRC_DIR)],
                    extra_cflags=["-O3", "-fopenmp"],
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(directory),
                    with_cuda=False,
                    verbose=verbose,
                )
        except Exception as exc:  # noqa: BLE001 - compiler/ninja/import errors of every kind
            raise NativeBuildError(f"{type(exc).__name__}: {_last_line(exc)}") from exc
        build_seconds = time.perf_counter() - started
        _module = module
        return module


@contextlib.contextmanager
def _build_lock(directory: Path) -> Iterator[None]:
    """Serialise builds across processes with a lock the OS drops if its holder dies.

    torch's own lock file is left behind by a killed build and then blocks every later load
    forever; while holding this lock no other picasso build runs, so such a file is stale.
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX: rely on torch's lock alone
        yield
        return
    with open(directory / "picasso.lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            (directory / "lock").unlink(missing_ok=True)
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _last_line(exc: BaseException) -> str:
    lines = [line for line in str(exc).strip().splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def main() -> int:
    try:
        module = load(verbose="-v" in sys.argv)
    except NativeBuildError as exc:
        print(f"picasso native: build failed: {exc}", file=sys.stderr)
        return 1
    print(f"picasso native: loaded {module.__file__} in {build_seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
