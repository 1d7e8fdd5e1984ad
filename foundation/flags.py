"""The domain of each number a command's flags take, declared once, as the flag's argparse type.

A value outside its domain is refused while the command line is parsed, before any work, in one
line naming the flag and the domain ("argument --rows: expected a whole number in [1, 2^36], got
'0'"). NaN, infinities and 0 where 0 means nothing are outside every domain: a flag not given is
None, never 0. Whole numbers may be written as 1e6 (an exact integer in float notation).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from foundation.fields import MAX_BATCH, MAX_RANKS, MAX_ROWS


def _bound(x: float) -> str:
    """A bound as written in a message: powers of two as 2^k, others plainly."""
    if isinstance(x, int) and x >= 1 << 20 and x & (x - 1) == 0:
        return f"2^{x.bit_length() - 1}"
    return f"{x:g}" if isinstance(x, float) else str(x)


@dataclass(frozen=True)
class Whole:
    """A whole number in [lo, hi]."""

    lo: int = 1
    hi: int = MAX_ROWS
    what: str = "a whole number"

    def __call__(self, text: str) -> int:
        value = _number(text, self.what)
        if not math.isfinite(value) or value != int(value):
            raise argparse.ArgumentTypeError(f"expected {self.what}, got {text!r}")
        value = int(value)
        if not self.lo <= value <= self.hi:
            raise argparse.ArgumentTypeError(
                f"expected {self.what} in [{_bound(self.lo)}, {_bound(self.hi)}], got {text!r}")
        return value

    def __repr__(self) -> str:  # argparse names the type in some messages
        return self.what


@dataclass(frozen=True)
class Real:
    """A finite number in [lo, hi], or (lo, hi] with lo_open."""

    lo: float
    hi: float
    lo_open: bool = False
    what: str = "a number"

    def __call__(self, text: str) -> float:
        value = float(_number(text, self.what))
        low_ok = value > self.lo if self.lo_open else value >= self.lo
        if not math.isfinite(value) or not low_ok or value > self.hi:
            left = "(" if self.lo_open else "["
            raise argparse.ArgumentTypeError(
                f"expected {self.what} in {left}{_bound(self.lo)}, {_bound(self.hi)}], got {text!r}")
        return value

    def __repr__(self) -> str:
        return self.what


def _number(text: str, what: str) -> int | float:
    s = text.strip()
    try:
        return int(s)
    except ValueError:
        pass
    try:
        return float(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None


# Domains several commands share; a flag with a domain of its own writes it beside the flag.
ROWS = Whole(1, MAX_ROWS, "a row count")
BATCH = Whole(1, MAX_BATCH, "a batch size")
RANKS = Whole(1, MAX_RANKS, "a process count")
SEED = Whole(0, (1 << 63) - 1, "a seed")
STEPS = Whole(1, 1 << 40, "a step count")
REPEATS = Whole(1, 1 << 16, "a count")
SECONDS = Real(0.0, 7 * 86400.0, lo_open=True, what="seconds")
