"""Recognising a click log's layout from its first lines, to refuse a wrong format or option.

A reader asked for the wrong format would otherwise take a data row for a header (one
feature named after a whole line) or count every row as malformed. These pure functions
look at the first lines of a file and say what they are, so the reader can stop with one
line naming what it saw and which format or option to try.
"""

from __future__ import annotations

import csv
import re
from collections import Counter
from collections.abc import Iterator

from traces.errors import TraceError

SEP_NAMES = {"tab": "\t", "comma": ",", "semicolon": ";", "space": " ", "pipe": "|"}
SEP_WORDS = {"\t": "tab", ",": "comma", ";": "semicolon", " ": "space", "|": "pipe"}
_ESCAPES = {"\\t": "\t", "\\s": " "}
_NUMBER = re.compile(r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$")
_HASH = re.compile(r"^(?=.*[0-9])[0-9a-fA-F]{6,}$")  # hashed IDs (Criteo, Avazu): hex with a digit
_LIBSVM_TOKEN = re.compile(r"^[0-9]+(:[^:\s]+){1,2}$")


def parse_sep(text: str) -> str:
    """A field separator from the command line: one character, an escape (\\t) or a name (tab)."""
    sep = SEP_NAMES.get(text.lower(), _ESCAPES.get(text, text))
    if len(sep) != 1:
        names = ", ".join(SEP_NAMES)
        raise TraceError(f"--sep {text!r}: expected one character, \\t, or one of {names}")
    return sep


MAX_FIELD_CHARS = 256 << 20  # a field may be as long as the longest line a reader holds (MAX_LINE_BYTES)


def csv_rows(lines, sep: str, **options) -> Iterator[list[str]]:
    """csv's reader with its field limit raised to a whole line's: csv's default (128 KiB) fails a
    long field with an anonymous error where a reader would read the row."""
    if csv.field_size_limit() < MAX_FIELD_CHARS:
        csv.field_size_limit(MAX_FIELD_CHARS)
    return csv.reader(lines, delimiter=sep, **options)


def split(line: str, sep: str) -> list[str]:
    return next(csv_rows([line], sep), [])


def is_data_token(token: str) -> bool:
    """A value a data row holds and a column name hardly ever is: empty, a number, a hash, idx:val."""
    t = token.strip()
    return not t or bool(_NUMBER.match(t) or _HASH.match(t) or _LIBSVM_TOKEN.match(t))


def libsvm_line(line: str, min_tokens: int = 1) -> bool:
    """`label idx:val ...` or `label field:idx:val ...` with at least `min_tokens` tokens."""
    parts = line.split()
    return (len(parts) > min_tokens and bool(_NUMBER.match(parts[0]))
            and all(_LIBSVM_TOKEN.match(p) for p in parts[1:]))


def looks_libsvm(lines: list[str]) -> bool:
    """Most lines are libsvm/libfm lines with at least one token."""
    return bool(lines) and sum(libsvm_line(x) for x in lines) >= 0.9 * len(lines)


def widths(lines: list[str], sep: str) -> Counter:
    return Counter(len(split(line, sep)) for line in lines)


def guess_layout(lines: list[str]) -> tuple[str, str]:
    """(what the lines look like, the options to try) from the first non-empty lines of a file."""
    lines = [x for x in lines if x.strip()]
    if looks_libsvm(lines):
        return "libsvm/libfm text (label idx:value ...)", "--format libsvm"
    best: tuple[int, str] | None = None
    for sep in ("\t", ",", ";", "|"):
        width, freq = widths(lines, sep).most_common(1)[0] if lines else (0, 0)
        if width > 1 and freq >= 0.9 * len(lines) and (best is None or width > best[0]):
            best = (width, sep)
    if best is None:
        return "one field per line with every usual separator", "--sep with the file's separator"
    width, sep = best
    header = not all(map(is_data_token, split(lines[0], sep)))
    desc = f"{width} {SEP_WORDS[sep]}-separated fields, {'a header row' if header else 'no header row'}"
    if sep == "\t" and width == 40 and not header:
        return desc + " (the Criteo layout)", "--format criteo"
    return desc, f"--format csv --sep {SEP_WORDS[sep]}" + ("" if header else " --no-header")


def header_problem(names: list[str], lines: list[str], sep: str, several: bool) -> str | None:
    """Why a first row that was taken for a header is not one (None when it is plausible).

    `lines` are the lines after it; `several`: the format needs more than one column.
    """
    if all(is_data_token(n) for n in names):
        return f"every field of it is a value ({', '.join(repr(n) for n in names[:4])}{', ...' if len(names) > 4 else ''})"
    if len(names) == 1:
        guess, _ = guess_layout(lines or [])
        if several or not guess.startswith("one field"):
            return f"it has one column when split on {SEP_WORDS.get(sep, repr(sep))}"
    body = [x for x in lines if x.strip()]
    counts = widths(body, sep)
    if body and len(names) not in counts:
        return f"it has {len(names)} fields but none of the {len(body)} lines after it has ({counts.most_common(1)[0][0]} mostly)"
    dup = [n for n, c in Counter(names).items() if c > 1]
    if dup:
        return f"column name {dup[0]!r} appears {Counter(names)[dup[0]]} times"
    return None
