"""Numbers as people read them: the one formatter of the terminal's tables and the HTML pages.

Counts get thousands separators (16,230 samples/s; 251,827,705 rows), never scientific notation;
fractions of one become percentages; rates and sizes get SI prefixes (2.2 GB/s); a value that
is missing is an empty cell, not "None"; snake_case keys become words with their unit
(`exchange_us` -> "exchange (us)").
"""

from __future__ import annotations

import math
from typing import Any

SI = ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
UNIT_SUFFIXES = {"us": "us", "ms": "ms", "s": "s", "bytes": "bytes", "mb": "MB", "gb": "GB", "mib": "MiB",
                 "gib": "GiB", "pct": "%"}
ACRONYMS = {"mape": "MAPE", "auc": "AUC", "hbm": "HBM", "ids": "IDs", "id": "ID", "mb": "MB", "a2a": "all-to-all",
            "cpu": "CPU", "gpu": "GPU", "rms": "RMS", "nic": "NIC", "pcie": "PCIe"}


def count(x: float | int | None) -> str:
    """A count or any number of magnitude >= 100: rounded to a whole number, with separators;
    smaller numbers keep three significant digits (12.3, 0.0123), never an exponent above 1e-4."""
    if x is None:
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return f"{x:,}"
    x = float(x)
    if not math.isfinite(x):
        return "n/a" if math.isnan(x) else ("inf" if x > 0 else "-inf")
    if abs(x) >= 100 or x == int(x) and abs(x) >= 1:
        return f"{x:,.0f}"
    if x == 0:
        return "0"
    if abs(x) < 1e-4:
        return f"{x:.2e}"
    text = f"{x:.{max(0, 2 - math.floor(math.log10(abs(x))))}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def percent(x: float | None, digits: int = 1) -> str:
    """A fraction of one as a percentage (0.123 -> 12.3%)."""
    return "" if x is None else f"{x * 100:.{digits}f}%"


def si(x: float | None, unit: str = "", digits: int = 3) -> str:
    """A rate or size with an SI prefix and `digits` significant digits: 2.2e11, "B/s" -> "220 GB/s"."""
    if x is None:
        return ""
    x = float(x)
    if not math.isfinite(x):
        return count(x)
    for scale, prefix in SI:
        if abs(x) >= scale:
            return f"{_sig(x / scale, digits)} {prefix}{unit}"
    return f"{_sig(x, digits)} {unit}".rstrip()


def duration_us(us: float | None) -> str:
    """Microseconds in the unit that reads best: 812 us, 34.7 ms, 1.52 s."""
    if us is None:
        return ""
    us = float(us)
    if abs(us) >= 1e6:
        return f"{_sig(us / 1e6, 3)} s"
    if abs(us) >= 1e3:
        return f"{_sig(us / 1e3, 3)} ms"
    return f"{_sig(us, 3)} us"


def _sig(x: float, digits: int) -> str:
    if x == 0:
        return "0"
    places = max(0, digits - 1 - math.floor(math.log10(abs(x))))
    return f"{x:,.{places}f}"


def cell(v: Any) -> str:
    """A table cell: numbers by `count`, lists joined, None empty, text as it is."""
    if v is None:
        return ""
    if isinstance(v, (bool, int, float)):
        return count(v)
    if isinstance(v, (list, tuple)):
        return ", ".join(cell(x) for x in v)
    return str(v)


def header(key: str) -> str:
    """A record's key as a column header: words, common acronyms, the unit in parentheses."""
    if not key or " " in key or "_" not in key and key.lower() not in ACRONYMS:
        return key
    words = key.split("_")
    unit = UNIT_SUFFIXES.get(words[-1].lower()) if len(words) > 1 else None
    if unit:
        words = words[:-1]
    text = " ".join(ACRONYMS.get(w.lower(), w) for w in words)
    return f"{text} ({unit})" if unit else text
