"""Settings declared once, as fields of a frozen dataclass: each field carries its help and its
domain, and one declaration gives the command line's flags, the checks every caller gets (the
command line, the Python API, a file read back) and the JSON form.

A check is a function of the flag's name and the value returning the one line that refuses it, or
None. Types are checked here (a bool is not an int, a float may be given as an int, an enum as its
value), domains by each field's check, so `0` or `nan` never slips through as "not given".
"""

from __future__ import annotations

import argparse
import math
import numbers
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, field, fields
from enum import Enum
from typing import Any

Check = Callable[[str, Any], "str | None"]


class SettingError(ValueError):
    """A setting out of its domain, or of the wrong type; str() is one line naming its flag."""


def setting(default: Any = MISSING, help: str = "", check: Check | None = None, *, positional: bool = False,
            const: Any = None, cli: bool = True) -> Any:
    """A field of a settings dataclass. `positional`: an argument, not a flag; `const`: the value of
    the flag given without one; `cli=False`: set by the program, never on the command line."""
    meta = {"help": help, "check": check, "positional": positional, "const": const, "cli": cli}
    return field(default=default, metadata=meta)


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def count(lo: int, hi: int) -> Check:
    """An integer in [lo, hi]; above hi is named as beyond any run."""
    def check(name: str, v: int) -> str | None:
        if v < lo:
            return f"{name} must be at least {lo}, got {v}"
        if v > hi:
            return f"{name} {v} is beyond any run this machine could finish (at most {hi:,})"
        return None
    return check


def number(lo: float, hi: float, *, lo_open: bool = False, unit: str = "") -> Check:
    """A finite number in [lo, hi], or (lo, hi] with lo_open."""
    def check(name: str, v: float) -> str | None:
        low = v <= lo if lo_open else v < lo
        if not math.isfinite(v) or low or v > hi:
            span = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            return f"{name} must be a finite number{unit} in {span}, got {v}"
        return None
    return check


def text(name: str, v: str) -> str | None:
    """A non-empty string without a line break (it names a file or an address)."""
    if not v.strip() or "\n" in v or "\x00" in v:
        return f"{name} must be a non-empty single-line text, got {v!r}"
    return None


def _kind(hint: Any) -> tuple[type, bool]:
    """(the base type, whether None is allowed) of a field's annotation."""
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and type(None) in args:
        (base,) = [a for a in args if a is not type(None)]
        return base, True
    return hint, False


def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _typed(name: str, base: type, v: Any) -> Any:
    """`v` as `base`, or SettingError."""
    if issubclass(base, Enum):
        try:
            return base(v)
        except ValueError:
            raise SettingError(f"{name} must be one of {', '.join(m.value for m in base)}, got {v!r}") from None
    if isinstance(v, bool):
        if base is bool:
            return v
    elif base is int and isinstance(v, numbers.Integral):
        return int(v)
    elif base is float and isinstance(v, numbers.Real):
        return float(v)
    elif base is not bool and isinstance(v, base):
        return v
    word = {int: "an integer", float: "a number", str: "a text", bool: "true or false"}.get(base, base.__name__)
    raise SettingError(f"{name} must be {word}, got {type(v).__name__} {v!r}")


def check_settings(obj: Any) -> None:
    """Every field of a settings dataclass typed and in its domain (called from __post_init__);
    coerces an int given for a float and a value given for an enum."""
    hints = _hints(type(obj))
    for f in fields(obj):
        base, optional = _kind(hints[f.name])
        v = getattr(obj, f.name)
        name = f.name if f.metadata.get("positional") else flag(f.name)
        if v is None:
            if not optional:
                raise SettingError(f"{name} must be given")
            continue
        v = _typed(name, base, v)
        object.__setattr__(obj, f.name, v)
        check = f.metadata.get("check")
        why = check(name, v) if check is not None else None
        if why is not None:
            raise SettingError(why)


def add_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """One argument per command-line field of `cls`, with its help, type, default and choices."""
    hints = _hints(cls)
    for f in fields(cls):
        m = f.metadata
        if not m.get("cli", True):
            continue
        base, _ = _kind(hints[f.name])
        default = None if f.default is MISSING else f.default
        kw: dict[str, Any] = {"help": m["help"]}
        if base is bool:
            kw["action"] = "store_true"
        elif issubclass(base, Enum):
            kw.update(choices=[x.value for x in base], default=default.value if default is not None else None)
        else:
            kw.update(type=base, default=default)
        if m["const"] is not None:
            kw.update(nargs="?", const=m["const"].value if isinstance(m["const"], Enum) else m["const"])
        if m["positional"]:
            parser.add_argument(f.name, **{k: v for k, v in kw.items() if k != "default"})
        else:
            parser.add_argument(flag(f.name), required=f.default is MISSING, **kw)


def from_namespace(cls: type, ns: argparse.Namespace) -> Any:
    """`cls` built from a parsed command line (its fields left off the command line at their defaults)."""
    return cls(**{f.name: getattr(ns, f.name) for f in fields(cls) if f.metadata.get("cli", True)})


def to_plain(obj: Any) -> dict[str, Any]:
    """The settings as JSON-ready data (an enum as its value)."""
    return {f.name: (v.value if isinstance(v := getattr(obj, f.name), Enum) else v) for f in fields(obj)}


def from_plain(cls: type, d: Any, where: str) -> Any:
    """`cls` from `to_plain`'s data: no unknown key, every value checked."""
    if not isinstance(d, dict):
        raise SettingError(f"{where}: expected an object of settings, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise SettingError(f"{where}: {unknown[0]!r} is not a setting (known: {', '.join(sorted(known))})")
    try:
        return cls(**d)
    except TypeError as exc:  # a required setting missing
        raise SettingError(f"{where}: {exc}") from None
