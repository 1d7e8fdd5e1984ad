"""Checks for numbers read from files: type, finite, range, integral where it must be.

Each loader (model spec, plan, profile, hot IDs, checkpoint manifest) calls these with
the dotted name of the field, so every bad value gets one line naming the field.
JSON allows NaN and Infinity, and float("nan") compares False with everything: a check
written as `x < 0` lets NaN through, these do not.
"""

from __future__ import annotations

import math
import numbers

MAX_RANKS = 1 << 20  # the largest cluster a plan or hardware spec may describe (planning it takes ~2 GB)
MAX_BATCH = 1 << 26  # samples per rank per step
MAX_ROWS = 1 << 48  # rows of a log, a dataset or a table (Criteo's terabyte log holds 2^32)


class FieldError(ValueError):
    """A field of a document has the wrong type or value; str() names the field."""


def _kind(value: object) -> str:
    return type(value).__name__ if not isinstance(value, str) else f"the string {value!r}"


def integer(value: object, field: str, lo: int | None = None, hi: int | None = None) -> int:
    """An integral number in [lo, hi]; 4.0 passes, 4.5, "4", True, NaN do not."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FieldError(f"field {field}: expected an integer, got {_kind(value)}")
    if isinstance(value, numbers.Integral):
        out = int(value)
    else:
        f = float(value)
        if not math.isfinite(f) or not f.is_integer():
            raise FieldError(f"field {field}: expected an integer, got {value!r}")
        out = int(f)
    if (lo is not None and out < lo) or (hi is not None and out > hi):
        raise FieldError(f"field {field}: expected an integer in {_range(lo, hi)}, got {out}")
    return out


def real(value: object, field: str, lo: float | None = None, hi: float | None = None,
         lo_open: bool = False) -> float:
    """A finite number in [lo, hi] (or (lo, hi] with lo_open); NaN and infinities fail."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise FieldError(f"field {field}: expected a number, got {_kind(value)}")
    out = float(value)
    if not math.isfinite(out):
        raise FieldError(f"field {field}: expected a finite number, got {value!r}")
    if (lo is not None and (out < lo or (lo_open and out == lo))) or (hi is not None and out > hi):
        raise FieldError(f"field {field}: expected a number in {_range(lo, hi, lo_open)}, got {value!r}")
    return out


def text(value: object, field: str, allowed: tuple[str, ...] | None = None) -> str:
    """A non-empty string (one of `allowed` when given)."""
    if not isinstance(value, str) or not value:
        raise FieldError(f"field {field}: expected a non-empty string, got {_kind(value)}")
    if allowed is not None and value not in allowed:
        raise FieldError(f"field {field}: {value!r} is not one of {list(allowed)}")
    return value


def file_name(value: object, field: str) -> str:
    """A file's name beside the document that gives it: one plain path component, so a file
    someone else wrote cannot point outside its own folder ('..', '/', a drive or a backslash)."""
    name = text(value, field)
    if name in (".", "..") or any(c in name for c in "/\\\0") or (len(name) > 1 and name[1] == ":"):
        raise FieldError(f"field {field}: {name!r} is not a file name in the document's own folder")
    return name


def boolean(value: object, field: str) -> bool:
    if not isinstance(value, bool):
        raise FieldError(f"field {field}: expected true or false, got {_kind(value)}")
    return value


def mapping(value: object, field: str) -> dict:
    if not isinstance(value, dict):
        raise FieldError(f"field {field}: expected an object, got {_kind(value)}")
    return value


def sequence(value: object, field: str) -> list:
    if not isinstance(value, (list, tuple)):
        raise FieldError(f"field {field}: expected a list, got {_kind(value)}")
    return list(value)


def _range(lo: float | None, hi: float | None, lo_open: bool = False) -> str:
    left = "(" if lo_open else "["
    return f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
