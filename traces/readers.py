"""Streaming readers for click logs: Criteo, Avazu, generic CSV/TSV, Parquet, libsvm/libfm.

Every reader yields `Chunk`s of bounded size (about `chunk_bytes` of input at a time, so a
1 GB file needs a few hundred MB at most) and never holds the whole file. Plain or gzip
(detected from the magic bytes), UTF-8 or the UTF-16/32 a byte-order mark names (foundation.text:
Windows tools write those; transcoded to UTF-8 as read, so such a file cannot be cut by byte
ranges, as gzip cannot). Malformed rows (wrong field count, non-hex where hex is
expected, bad numbers) are skipped and counted; `strict=True` raises `TraceError` naming
file, line and field at the first one. How raw values become int64 IDs: see traces/ids.py.
"""

from __future__ import annotations

import csv
import io
import os
import re
import stat
import zlib
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv

from foundation.documents import read_text
from foundation.files import file_kind
from foundation.text import sniff, transcoded
from traces.errors import TraceError
from traces.filetype import text_head
from traces.ids import MAX_VALUE_BYTES, ints_to_ids, parse_hex8_present, string_buffers, strings_to_ids
from traces.sniff import (
    MAX_FIELD_CHARS,
    SEP_WORDS,
    csv_rows,
    guess_layout,
    header_problem,
    libsvm_line,
    parse_sep,
    split,
    widths,
)

FORMATS = ("criteo", "avazu", "csv", "parquet", "libsvm")
MAX_BAD_LINES = 10
MAX_LINE_BYTES = MAX_FIELD_CHARS  # one row's line, held whole while it is parsed
MAX_COLUMNS = 1 << 12  # columns (or libsvm fields) of one log
PARSE_BLOCK = 1 << 20  # bytes pyarrow parses per thread; a longer line is parsed in a block of its own
CRITEO_DENSE = [f"I{i}" for i in range(1, 14)]
CRITEO_SPARSE = [f"C{i}" for i in range(1, 27)]
AVAZU_LABEL = "click"
AVAZU_SKIP = ("id",)
_INDEX = re.compile(r"[0-9]{1,18}")  # a libsvm index as the token parser reads it (an int64)
_NUMBER_RE = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"

Progress = Callable[[float, float], None]


@dataclass
class Chunk:
    first_row: int  # 0-based index in the file of the chunk's first good row
    labels: np.ndarray  # float32 [n]
    dense: np.ndarray  # float32 [n, num_dense]; missing -> 0.0; raw values
    sparse: dict[str, tuple[np.ndarray, np.ndarray]]  # feature -> (ids int64 [nnz], offsets int64 [n+1])

    @property
    def rows(self) -> int:
        return len(self.labels)


@dataclass
class ReadStats:
    rows_ok: int = 0
    rows_bad: int = 0
    first_bad_lines: list[int] = field(default_factory=list)  # 1-based line numbers
    first_bad_reasons: list[str] = field(default_factory=list)

    def add_bad(self, line: int, reason: str) -> None:
        self.rows_bad += 1
        if len(self.first_bad_lines) < MAX_BAD_LINES:
            self.first_bad_lines.append(line)
            self.first_bad_reasons.append(reason)


# ---------------------------------------------------------------------------------------
# Opening files and cutting them into line-aligned blocks
# ---------------------------------------------------------------------------------------
def check_width(path: str, count: int, what: str) -> None:
    """Refuse a log wider than MAX_COLUMNS: every column costs a profile entry, a table and a parse."""
    if count > MAX_COLUMNS:
        raise TraceError(f"{path}: {count:,} {what}, more than the {MAX_COLUMNS:,} a click log may have "
                         "(published ones have at most about a thousand)")


def check_file(path: str | os.PathLike) -> str:
    """The path as str, or a TraceError in one line when it is missing/empty/unreadable."""
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        raise TraceError(f"{p}: no such file") from None
    except OSError as exc:
        raise TraceError(f"{p}: cannot read ({exc.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise TraceError(f"{p}: is a directory, expected a data file")
    if not stat.S_ISREG(st.st_mode):  # a log is read more than once (layout check, byte ranges)
        raise TraceError(f"{p}: is {file_kind(st.st_mode)}, not a regular file: save the data to a file first")
    if not os.access(p, os.R_OK):
        raise TraceError(f"{p}: not readable (permission denied)")
    if st.st_size == 0:
        raise TraceError(f"{p}: file is empty")
    return p


def _is_gzip(path: str) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == b"\x1f\x8b"


def _encoding(path: str, gzip: bool) -> tuple[str, int]:
    """(codec, BOM length) of a text file by foundation.text's rule (inside its gzip stream)."""
    with open(path, "rb") as f:
        head = f.read(1 << 12)
    if gzip:
        try:
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, 8)
        except zlib.error:
            return "utf-8", 0  # a damaged stream is named when it is read
    return sniff(head)


def whole_read_reason(path: str) -> str | None:
    """Why `path` cannot be cut into byte ranges at line ends (None when it can): its bytes are not
    the text's (gzip), or a line end is not the byte 0x0a (UTF-16/32)."""
    if _is_gzip(path):
        return "gzip-compressed"
    codec, _ = _encoding(path, False)
    return None if codec == "utf-8" else f"{codec.upper()} text"


class _BlockSource:
    """Line-aligned byte blocks of a plain or gzip text file, with 1-based line numbers.

    `byte_range=(lo, hi)` (plain files only) keeps the lines that start at a byte in [lo, hi):
    it seeks to lo, skips to the next line end and stops after the line that crosses hi, so
    ranges that tile a file read every line exactly once. Line numbers then count from the
    range's first line; `absolute_line` turns one into the file's (counting the lines before
    the range once, only when a message needs it)."""

    def __init__(self, path: str, chunk_bytes: int, byte_range: tuple[int, int] | None = None) -> None:
        self.path = path
        self.chunk_bytes = max(int(chunk_bytes), 1 << 12)
        self.gzip = _is_gzip(path)
        self.codec, bom = _encoding(path, self.gzip)
        self.bytes_total = os.path.getsize(path)
        self.bytes_done = 0
        self.range = byte_range
        if byte_range is not None and (self.gzip or self.codec != "utf-8"):
            what = "a gzip file" if self.gzip else f"a {self.codec.upper()} file"
            raise TraceError(f"{path}: {what} cannot be read by byte ranges (convert it with `picasso convert`)")
        self.start = max(self._line_start(byte_range[0]) if byte_range is not None else 0, bom)  # after a BOM
        self.from_start = self.start == bom  # the file's first line is this source's first (a header's place)
        self._lines_before: int | None = 0 if self.from_start else None

    def _line_start(self, lo: int) -> int:
        """The first line start at or after byte lo (the file's size when there is none)."""
        if lo <= 0:
            return 0
        with open(self.path, "rb", buffering=0) as f:
            pos = lo - 1
            f.seek(pos)
            while True:
                buf = f.read(1 << 16)
                if not buf:
                    return self.bytes_total
                nl = buf.find(b"\n")
                if nl >= 0:
                    return pos + nl + 1
                pos += len(buf)

    def absolute_line(self, line: int) -> int:
        """A line number of this source as the file's line number."""
        if self._lines_before is None:
            n, left = 0, self.start
            with open(self.path, "rb", buffering=0) as f:
                while left > 0:
                    buf = f.read(min(left, 1 << 24))
                    if not buf:
                        break
                    n += buf.count(b"\n")
                    left -= len(buf)
            self._lines_before = n
        return line + self._lines_before

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        if not self.gzip and self.codec == "utf-8":
            yield from self._plain()
            return
        line = 1
        rest = _Pending()  # the unfinished line: its pieces are joined once, when its end arrives
        for buf in transcoded(self._stream()):  # UTF-8, its BOM removed
            cut = buf.rfind(b"\n")  # only the new bytes are searched: linear in the line's length
            if cut < 0:
                rest.add(buf)
                self._check_line(rest.size, line)
                continue
            block = rest.take(buf[: cut + 1])
            rest.add(buf[cut + 1 :])
            yield block, line
            line += block.count(b"\n")
        if rest.size:
            yield rest.take(b"\n"), line

    def _stream(self) -> Iterator[bytes]:
        """The file's bytes from its start, decompressed when gzip, in blocks of about chunk_bytes."""
        if self.gzip:
            raw = pa.OSFile(self.path, "rb")
            stream = pa.CompressedInputStream(raw, "gzip")
        else:
            raw = stream = pa.OSFile(self.path, "rb")
        try:
            while True:
                try:
                    buf = stream.read(self.chunk_bytes)
                except (OSError, pa.ArrowException) as exc:
                    raise TraceError(f"{self.path}: cannot read ({_first_line(exc)})") from None
                self.bytes_done = raw.tell()
                if not buf:
                    return
                yield buf
        finally:
            stream.close()
            raw.close()

    def _check_line(self, size: int, line: int) -> None:
        """A line is held whole in memory: past MAX_LINE_BYTES the file is not a log of rows."""
        if size > MAX_LINE_BYTES:
            raise TraceError(f"{self.path}: line {self.absolute_line(line)} runs over {MAX_LINE_BYTES >> 20} MiB "
                             "without a line end: not one row per line (a binary or damaged file?)")

    def _long_line(self, f, buf: bytes, line: int) -> tuple[bytes, int]:
        """`buf` (no line end in it) extended by whole blocks until one holds a line end, or the file
        ends: only each new block is searched, and the pieces are joined once."""
        pending = _Pending()
        pending.add(buf)
        while True:
            self._check_line(pending.size, line)
            more = f.read(self.chunk_bytes)
            if not more:
                return pending.take(b""), -1
            cut = more.rfind(b"\n")
            if cut >= 0:
                base = pending.size
                return pending.take(more), base + cut
            pending.add(more)

    def _plain(self) -> Iterator[tuple[bytes, int]]:
        """Plain files: read a block, cut after its last newline, seek back to the cut."""
        line = 1
        pos = self.start
        hi = self.range[1] if self.range is not None else self.bytes_total + 1
        with open(self.path, "rb", buffering=0) as f:
            f.seek(pos)
            while pos < hi:
                first = pos
                try:
                    buf = f.read(self.chunk_bytes)
                except OSError as exc:
                    raise TraceError(f"{self.path}: cannot read ({_first_line(exc)})") from None
                if not buf:
                    break
                cut = buf.rfind(b"\n")
                if cut < 0 and len(buf) >= self.chunk_bytes:  # a line longer than a block
                    buf, cut = self._long_line(f, buf, line)
                if cut < 0 or cut == len(buf) - 1:
                    block = buf if cut >= 0 else buf + b"\n"
                    pos += len(buf)
                else:
                    block = buf[: cut + 1]
                    pos += cut + 1
                    f.seek(pos)
                if pos > hi:  # the block crosses the range's end: stop after the line holding byte hi-1
                    end = block.find(b"\n", hi - 1 - first)
                    if end >= 0:
                        block = block[: end + 1]
                    pos = hi
                self.bytes_done = pos
                yield block, line
                line += block.count(b"\n")


class _Pending:
    """Pieces of bytes gathered until they are used together: joined once (a `+=` per piece copies
    everything gathered so far each time, quadratic in a long line)."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.size = 0

    def add(self, piece: bytes) -> None:
        if piece:
            self.pieces.append(piece)
            self.size += len(piece)

    def take(self, last: bytes) -> bytes:
        """The pieces and `last` as one bytes object; empties the buffer."""
        out = b"".join([*self.pieces, last]) if self.pieces else last
        self.pieces, self.size = [], 0
        return out


def sample_lines(path: str, max_lines: int = 200, max_bytes: int = 1 << 20) -> list[str]:
    """The first lines of a text file (plain or gzip), decoded leniently, for layout checks."""
    text_head(path)  # one line naming the file and what it is when it is not text
    lines: list[str] = []
    size = 0
    for block, _ in _BlockSource(path, 1 << 16):
        if b"\0" in block:
            raise TraceError(f"{path}: binary data (NUL bytes) in a text format: check the file and --format")
        lines.extend(block.decode("utf-8", "replace").splitlines())
        size += len(block)
        if len(lines) > max_lines or size >= max_bytes:
            break
    return [x.rstrip("\r") for x in lines[:max_lines]]


def no_rows_reason(reader: Reader) -> str:
    """Why a file gave no rows, in one line: every row malformed (the first reason), or none there."""
    stats = reader.stats
    if stats.rows_bad == 0:
        return f"{reader.path}: no data rows in the file (only a header, blank lines or nothing to read)"
    first = f"; first: {stats.first_bad_reasons[0]}" if stats.first_bad_reasons else ""
    return f"{reader.path}: no valid rows ({stats.rows_bad:,} malformed{first})"


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


# ---------------------------------------------------------------------------------------
# Readers
# ---------------------------------------------------------------------------------------
class Reader:
    """Iterable of Chunk. Attributes: feature_names, dense_names, stats, bytes_total."""

    fmt = ""

    def __init__(self, path: str, *, strict: bool, chunk_bytes: int, progress: Progress | None) -> None:
        self.path = check_file(path)
        self.strict = strict
        self.chunk_bytes = chunk_bytes
        self.progress = progress
        self.stats = ReadStats()
        self.bytes_total = os.path.getsize(self.path)
        self.bytes_done = 0.0  # input consumed so far (compressed bytes for gzip)
        self.feature_names: list[str] = []
        self.dense_names: list[str] = []
        self.label_name: str | None = None
        self.warnings: list[str] = []  # doubts about the layout, complete once iteration ends

    def __iter__(self) -> Iterator[Chunk]:
        raise NotImplementedError

    def _line(self, line: int) -> int:
        """A line number as the file's (a byte-range source counts from its range's first line)."""
        src = getattr(self, "source", None)
        return src.absolute_line(line) if isinstance(src, _BlockSource) else line

    def _bad(self, line: int, fieldname: str, reason: str) -> None:
        line = self._line(line)
        where = f"{self.path}:{line}: field {fieldname}: {reason}" if fieldname else f"{self.path}:{line}: {reason}"
        if self.strict:
            raise TraceError(where)
        self.stats.add_bad(line, where)

    def _report(self, done: float) -> None:
        self.bytes_done = float(done)
        if self.progress is not None:
            self.progress(done, self.bytes_total)


@dataclass
class _Column:
    name: str
    kind: str  # "label", "dense", "sparse", "skip"
    hex8: bool = False  # Criteo hashes
    multi_sep: str | None = None


class DelimitedReader(Reader):
    """Delimited text (Criteo TSV, Avazu CSV, generic CSV/TSV), parsed block by block with pyarrow."""

    def __init__(
        self,
        path: str,
        fmt: str,
        *,
        strict: bool = False,
        chunk_bytes: int = 16 << 20,
        progress: Progress | None = None,
        sep: str | None = None,
        header: bool | None = None,
        label: str | None = None,
        dense: list[str] | str | None = None,
        categorical: list[str] | str | None = None,
        multi_sep: str | None = None,
        multi: list[str] | str | None = None,
        skip: list[str] | str | None = None,
        byte_range: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(path, strict=strict, chunk_bytes=chunk_bytes, progress=progress)
        self.fmt = fmt
        self.source = _BlockSource(self.path, chunk_bytes, byte_range)
        self.quoting = fmt != "criteo"
        default_sep = "\t" if fmt == "criteo" or self.path.endswith((".tsv", ".tsv.gz")) else ","
        self.sep = parse_sep(sep) if sep is not None else default_sep
        lines = sample_lines(self.path)
        if fmt == "criteo":
            self.header = bool(header)
            names = ["label", *CRITEO_DENSE, *CRITEO_SPARSE]
            self.columns = (
                [_Column("label", "label")]
                + [_Column(n, "dense") for n in CRITEO_DENSE]
                + [_Column(n, "sparse", hex8=True) for n in CRITEO_SPARSE]
            )
            if self.header:
                names = self._read_header()
                if len(names) != 40:
                    raise TraceError(f"{self.path}:1: expected 40 Criteo columns in the header, got {len(names)}")
            self._check_width(lines[1:] if self.header else lines, 40)
        else:
            self.header = True if header is None else bool(header)
            if self.header:
                names = self._read_header()
                problem = header_problem(names, lines[1:], self.sep, several=fmt == "avazu")
                if header is None and problem:
                    desc, hint = guess_layout(lines)
                    raise TraceError(f"{self.path}:1: this is not a header row: {problem}; the file looks like "
                                     f"{desc}: try {hint} (or --header if line 1 does name the columns)")
                counts = Counter(names)
                dup = next((n for n in names if counts[n] > 1), None)
                if dup is not None:
                    raise TraceError(f"{self.path}:1: column name {dup!r} appears {counts[dup]} times "
                                     "in the header (or try --no-header)")
            else:
                width = widths(lines, self.sep).most_common(1)[0][0] if lines else 0
                names = [f"c{i + 1}" for i in range(width)]  # no header: columns named by position
                self._check_width(lines, width)
            check_width(self.path, len(names), "columns")
            self.columns = self._columns_from_options(fmt, names, label, dense, categorical, multi_sep, multi, skip)
        self.names = [c.name for c in self.columns]
        self.label_name = next((c.name for c in self.columns if c.kind == "label"), None)
        self.dense_names = [c.name for c in self.columns if c.kind == "dense"]
        self.feature_names = [c.name for c in self.columns if c.kind == "sparse"]
        if not self.feature_names:
            raise TraceError(f"{self.path}: no categorical columns to read")

    # -- header and column roles ------------------------------------------------------
    def _check_width(self, lines: list[str], width: int) -> None:
        """A wrong format or --sep splits no line into the expected fields: stop, naming a better guess."""
        body = [x for x in lines if x.strip()]
        if not body or any(len(split(x, self.sep)) == width for x in body):
            return
        got = len(split(body[0], self.sep))
        desc, hint = guess_layout(body)
        raise TraceError(f"{self.path}: expected {width} {SEP_WORDS.get(self.sep, repr(self.sep))}-separated fields "
                         f"({self.fmt}), but none of the first {len(body)} lines has them (the first has {got}); "
                         f"the file looks like {desc}: try {hint}")

    def _read_header(self) -> list[str]:
        for block, _ in _BlockSource(self.path, 1 << 16):
            first = block.split(b"\n", 1)[0].rstrip(b"\r")
            try:
                text = first.decode("utf-8")
            except UnicodeDecodeError:
                raise TraceError(f"{self.path}:1: header is not UTF-8 text") from None
            row = next(csv_rows([text], self.sep))
            names = [n.strip() for n in row]
            check_width(self.path, len(names), "columns")
            if not any(names):
                raise TraceError(f"{self.path}:1: empty header row")
            return names
        raise TraceError(f"{self.path}: file is empty")

    def _columns_from_options(self, fmt, names, label, dense, categorical, multi_sep, multi, skip) -> list[_Column]:
        def as_list(v):
            if v is None:
                return None
            return [s.strip() for s in v.split(",") if s.strip()] if isinstance(v, str) else list(v)

        dense_l, cat_l, multi_l = as_list(dense) or [], as_list(categorical), as_list(multi)
        skip_given = as_list(skip) or []
        skip_l = skip_given or (list(AVAZU_SKIP) if fmt == "avazu" else [])
        if label is None:
            label = next((n for n in ("label", "click", "Label", "y") if n in names), None)
        for n in [*dense_l, *(cat_l or []), *(multi_l or []), *skip_given, *([label] if label else [])]:
            if n not in names:
                raise TraceError(f"{self.path}:1: column {n!r} not in the header ({', '.join(names[:12])}...)")
        _check_roles(self.path, {"the label": [label] if label else [], "dense": dense_l,
                                 "categorical": cat_l or [], "skipped": skip_given})
        cols = []
        for n in names:
            if n == label:
                cols.append(_Column(n, "label"))
            elif n in dense_l:
                cols.append(_Column(n, "dense"))
            elif n in skip_l or (cat_l is not None and n not in cat_l):
                cols.append(_Column(n, "skip"))
            else:
                sep = multi_sep if multi_sep and (multi_l is None or n in multi_l) else None
                cols.append(_Column(n, "sparse", multi_sep=sep))
        return cols

    # -- reading ------------------------------------------------------------------------
    def _parse(self, block: bytes, all_strings: bool, bad_rows: list) -> pa.Table:
        try:
            return self._parse_blocks(block, all_strings, bad_rows, PARSE_BLOCK)
        except pa.ArrowInvalid as exc:
            if "straddling" not in str(exc):
                raise
        # a line longer than pyarrow's block (one huge field): parse this block as one; the
        # row then meets the same field checks as any other
        del bad_rows[:]
        return self._parse_blocks(block, all_strings, bad_rows, len(block) + 1)

    def _parse_blocks(self, block: bytes, all_strings: bool, bad_rows: list, block_size: int) -> pa.Table:
        def handler(row):
            bad_rows.append(row)
            return "skip"

        # Text columns as binary: no UTF-8 validation cost, and bad bytes reach our checks.
        types = {c.name: pa.float64() if c.kind in ("label", "dense") and not all_strings else pa.binary()
                 for c in self.columns}  # fmt: skip
        return pcsv.read_csv(
            pa.py_buffer(block),
            read_options=pcsv.ReadOptions(column_names=self.names, use_threads=True, block_size=block_size),
            parse_options=pcsv.ParseOptions(
                delimiter=self.sep,
                quote_char='"' if self.quoting else False,
                newlines_in_values=False,
                invalid_row_handler=handler,
            ),
            convert_options=pcsv.ConvertOptions(
                column_types=types,
                null_values=[""],
                strings_can_be_null=False,
                quoted_strings_can_be_null=False,
                include_columns=[c.name for c in self.columns if c.kind != "skip"],
            ),
        )

    def __iter__(self) -> Iterator[Chunk]:
        # A worker thread reads and parses block k+1 (pyarrow and most numpy work release
        # the GIL) while the caller consumes chunk k. Blocks are still handled in order.
        blocks = iter(self.source)

        def next_chunk() -> tuple[Chunk | None, float]:
            for block, line in blocks:
                if line == 1 and self.header and self.source.from_start:
                    nl = block.find(b"\n")
                    block, line = block[nl + 1 :], 2
                    if not block.strip(b"\r\n"):
                        continue
                chunk = self._read_block(block, line, 0)
                if chunk is not None:
                    return chunk, self.source.bytes_done
            return None, self.source.bytes_done

        first_row = 0
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="picasso-read") as pool:
            pending = pool.submit(next_chunk)
            while True:
                chunk, done = pending.result()
                self._report(done)
                if chunk is None:
                    return
                pending = pool.submit(next_chunk)
                chunk.first_row = first_row
                first_row += chunk.rows
                self.stats.rows_ok += chunk.rows
                yield chunk

    def _read_block(self, block: bytes, line: int, first_row: int) -> Chunk | None:
        bad_rows: list = []
        slow = False
        try:
            table = self._parse(block, False, bad_rows)
        except pa.ArrowInvalid as exc:
            if "conversion error" not in str(exc) and "CSV parse error" not in str(exc):
                raise TraceError(f"{self.path}: near line {line}: {_first_line(exc)}") from None
            bad_rows = []
            slow = True
            table = self._parse(block, True, bad_rows)
        n = table.num_rows
        row_bad = np.zeros(n, dtype=bool)
        problems: list[tuple[int, str, str]] = []  # (table row, field, reason)
        labels = np.zeros(n, dtype=np.float32)
        dense = np.zeros((n, len(self.dense_names)), dtype=np.float32)
        sparse_raw: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        di = 0
        for c in self.columns:
            if c.kind == "skip":
                continue
            col = table.column(c.name).combine_chunks() if n else pa.array([], table.schema.field(c.name).type)
            if c.kind in ("label", "dense"):
                vals, bad = self._numbers(col, slow, c.kind == "label")
                for r in np.flatnonzero(bad & ~row_bad)[: MAX_BAD_LINES + 1]:
                    problems.append((int(r), c.name, f"expected a number, got {_show(col[int(r)])}"))
                row_bad |= bad
                if c.kind == "label":
                    row_bad |= _bad_labels(vals, row_bad, problems, c.name)
                if c.kind == "label":
                    labels = vals
                else:
                    dense[:, di] = vals
                    di += 1
            else:
                ids, offsets, bad = self._categorical(col, c)
                for r in np.flatnonzero(bad & ~row_bad)[: MAX_BAD_LINES + 1]:
                    problems.append((int(r), c.name, _value_problem(col[int(r)], c.hex8)))
                row_bad |= bad
                sparse_raw[c.name] = (ids, offsets)
        if bad_rows or problems:
            self._report_bad(block, line, bad_rows, problems, row_bad)
        keep = ~row_bad
        if not keep.all():
            labels, dense = labels[keep], dense[keep]
            sparse_raw = {k: _filter_bags(ids, off, keep) for k, (ids, off) in sparse_raw.items()}
        if len(labels) == 0:
            return None
        return Chunk(first_row=first_row, labels=labels, dense=dense, sparse=sparse_raw)

    def _numbers(self, col: pa.Array, slow: bool, required: bool) -> tuple[np.ndarray, np.ndarray]:
        n = len(col)
        if not slow:
            missing = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
            vals = col.fill_null(0).to_numpy(zero_copy_only=False).astype(np.float32)
            bad = missing if required else np.zeros(n, dtype=bool)
            return vals, bad
        s = col if pa.types.is_binary(col.type) else pc.cast(col, pa.binary())
        empty = np.asarray(pc.equal(pc.binary_length(s), 0).to_numpy(zero_copy_only=False), dtype=bool)
        ok = np.asarray(pc.match_substring_regex(s, _NUMBER_RE).to_numpy(zero_copy_only=False), dtype=bool)
        bad = ~ok & ~empty
        if required:
            bad |= empty
        good = pc.cast(pc.if_else(pa.array(ok), s, pa.scalar(b"0")), pa.string())  # ASCII after the check
        vals = pc.cast(pc.utf8_trim_whitespace(good), pa.float64()).to_numpy(zero_copy_only=False)
        vals = vals.astype(np.float32)
        vals[~ok] = 0.0
        return vals, bad

    def _categorical(self, col: pa.Array, c: _Column) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if c.hex8:
            vals, present, bad = parse_hex8_present(col)
            return vals, _offsets_from_present(present), bad
        col, bad = _without_long_values(col)
        if c.multi_sep:
            return (*_split_multi(col, c.multi_sep), bad)
        ids, present = strings_to_ids(col)
        return ids[present], _offsets_from_present(present), bad

    def _report_bad(self, block: bytes, line: int, bad_rows: list, problems: list, row_bad: np.ndarray) -> None:
        """Map table rows back to file lines (rare path) and record/raise, in line order."""
        items: list[tuple[int, str, str]] = []
        row_lines, short_lines = _row_line_numbers(block, line, self.sep, len(self.names), self.quoting)
        for ln, count in short_lines:
            items.append((ln, "", f"expected {len(self.names)} fields, got {count}"))
        for r, name, reason in problems:
            items.append((row_lines[r] if r < len(row_lines) else line, name, reason))
        reported = {ln for ln, _, _ in items}
        extra = [int(row_lines[r]) for r in np.flatnonzero(row_bad) if r < len(row_lines)]
        items.sort()
        for ln, name, reason in items:
            self._bad(ln, name, reason)
        # Bad rows beyond the first few reported per column are counted, not described.
        self.stats.rows_bad += sum(1 for ln in extra if ln not in reported)
        # Rows pyarrow skipped that the line scan could not place (should not happen).
        self.stats.rows_bad += max(len(bad_rows) - len(short_lines), 0)


def _check_roles(path: str, roles: dict[str, list[str]]) -> None:
    """Each column in one role at most: a column named twice would be read as one of them silently."""
    seen: dict[str, str] = {}
    for role, columns in roles.items():
        for n in columns:
            if n in seen:
                same = f"named twice as {role}" if seen[n] == role else f"both {seen[n]} and {role}"
                raise TraceError(f"{path}: column {n!r} is {same}; give each column one role")
            seen[n] = role


def _without_long_values(col: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """(the column with values over MAX_VALUE_BYTES made missing, which rows held one): such a row is
    malformed, and its value is never hashed."""
    t = col.type
    if not (pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t)
            or pa.types.is_large_binary(t)):
        return col, np.zeros(len(col), dtype=bool)
    offsets, _, valid = string_buffers(col)
    long = np.diff(offsets) > MAX_VALUE_BYTES
    if valid is not None:
        long &= valid
    if not long.any():
        return col, long
    return pc.if_else(pa.array(long), pa.scalar(None, t), col), long


def _value_problem(value, hex8: bool) -> str:
    """Why a categorical value was refused."""
    raw = value.as_py()
    if not hex8 and raw is not None and len(raw) > MAX_VALUE_BYTES:
        return f"a value of {len(raw):,} bytes, more than the {MAX_VALUE_BYTES:,} a categorical value may hold"
    return f"expected {'8 hex characters' if hex8 else 'a value'}, got {_show(value)}"


def _bad_labels(vals: np.ndarray, row_bad: np.ndarray, problems: list, name: str) -> np.ndarray:
    """Rows whose label is a number but not a click (0 or 1): a loss on them means nothing."""
    bad = ~row_bad & (vals != 0) & (vals != 1)
    for r in np.flatnonzero(bad)[: MAX_BAD_LINES + 1]:
        problems.append((int(r), name, f"expected a label 0 or 1, got {float(vals[r]):g}"))
    return bad


def _show(v) -> str:
    x = v.as_py() if hasattr(v, "as_py") else v
    if isinstance(x, bytes):
        x = x.decode("utf-8", "replace")
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "...'"


def _row_line_numbers(block: bytes, first_line: int, sep: str, ncols: int, quoting: bool):
    """For each row pyarrow kept, its 1-based file line; plus (line, fields) of wrong-width rows."""
    text = block.decode("utf-8", "replace")
    reader = csv_rows(
        io.StringIO(text, newline=""),
        sep,
        quoting=csv.QUOTE_MINIMAL if quoting else csv.QUOTE_NONE,
        strict=False,
    )
    rows, short = [], []
    start = first_line
    try:
        for row in reader:
            end = first_line + reader.line_num - 1
            if row:
                if len(row) == ncols:
                    rows.append(start)
                else:
                    short.append((start, len(row)))
            start = end + 1
    except csv.Error:
        pass
    return np.asarray(rows, dtype=np.int64), short


def _offsets_from_present(present: np.ndarray) -> np.ndarray:
    off = np.zeros(len(present) + 1, dtype=np.int64)
    np.cumsum(present, out=off[1:])
    return off


def _filter_bags(ids: np.ndarray, offsets: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lengths = np.diff(offsets)
    elem_keep = np.repeat(keep, lengths)
    new_off = np.zeros(int(keep.sum()) + 1, dtype=np.int64)
    np.cumsum(lengths[keep], out=new_off[1:])
    return ids[elem_keep], new_off


def _split_multi(col: pa.Array, sep: str) -> tuple[np.ndarray, np.ndarray]:
    """'a|b|c' -> bag of three IDs; empty parts are dropped (a missing value = empty bag)."""
    t = col.type
    text = pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t)
    s = col if text else pc.cast(col, pa.string())
    lists = pc.split_pattern(s.fill_null(pa.scalar(b"" if pa.types.is_binary(s.type) else "", s.type)), sep)
    return _list_to_bags(lists)


def _list_to_bags(lists: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    lists = lists.fill_null(pa.scalar([], lists.type)) if lists.null_count else lists
    flat = pc.list_flatten(lists)
    parent = pc.list_parent_indices(lists).to_numpy(zero_copy_only=False)
    n = len(lists)
    if pa.types.is_integer(flat.type):
        keep = np.asarray(flat.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        ids = ints_to_ids(flat.fill_null(0).to_numpy(zero_copy_only=False))
    else:
        ids, keep = strings_to_ids(flat)
    ids, parent = ids[keep], parent[keep]
    counts = np.bincount(parent, minlength=n) if len(parent) else np.zeros(n, dtype=np.int64)
    off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=off[1:])
    return ids, off


class ParquetReader(Reader):
    """Parquet with named label, dense and categorical columns (lists = multi-valued bags).

    Rows are numbered from 1 in error messages ("line" = row number in the file).
    """

    fmt = "parquet"

    def __init__(
        self,
        path: str,
        *,
        strict: bool = False,
        chunk_bytes: int = 16 << 20,
        progress: Progress | None = None,
        label: str | None = None,
        dense: list[str] | str | None = None,
        categorical: list[str] | str | None = None,
        multi_sep: str | None = None,
        multi: list[str] | str | None = None,
        skip: list[str] | str | None = None,
        **_: object,
    ) -> None:
        super().__init__(path, strict=strict, chunk_bytes=chunk_bytes, progress=progress)
        import pyarrow.parquet as pq

        try:
            self.pf = pq.ParquetFile(self.path)
        except (pa.ArrowException, OSError) as exc:
            raise TraceError(f"{self.path}: not a readable Parquet file ({_first_line(exc)})") from None
        names = self.pf.schema_arrow.names
        check_width(self.path, len(names), "columns")
        counts = Counter(names)
        dup = sorted(n for n, k in counts.items() if k > 1)
        if dup:  # pyarrow would say 'Field "0" exists 5 times in schema' later, naming no file
            raise TraceError(f"{self.path}: column {dup[0]!r} appears {counts[dup[0]]} times; "
                             "every column needs its own name")
        helper = DelimitedReader.__new__(DelimitedReader)
        helper.path = self.path
        self.columns = DelimitedReader._columns_from_options(
            helper, "parquet", names, label, dense, categorical, multi_sep, multi, skip
        )
        self.label_name = next((c.name for c in self.columns if c.kind == "label"), None)
        self.dense_names = [c.name for c in self.columns if c.kind == "dense"]
        self.feature_names = [c.name for c in self.columns if c.kind == "sparse"]
        if not self.feature_names:
            raise TraceError(f"{self.path}: no categorical columns to read")
        rows = max(self.pf.metadata.num_rows, 1)
        self.batch_rows = max(1024, int(chunk_bytes / max(self.bytes_total / rows, 1)))

    def __iter__(self) -> Iterator[Chunk]:
        first_row, file_row = 0, 0
        used = [c.name for c in self.columns if c.kind != "skip"]
        try:
            batches = self.pf.iter_batches(batch_size=self.batch_rows, columns=used)
            for batch in batches:
                chunk = self._convert(batch, file_row, first_row)
                file_row += batch.num_rows
                self._report(self.bytes_total * file_row / max(self.pf.metadata.num_rows, 1))
                if chunk is None:
                    continue
                first_row += chunk.rows
                self.stats.rows_ok += chunk.rows
                yield chunk
        except (pa.ArrowException, OSError) as exc:
            raise TraceError(f"{self.path}: cannot read Parquet data ({_first_line(exc)})") from None

    def _convert(self, batch: pa.RecordBatch, file_row: int, first_row: int) -> Chunk | None:
        n = batch.num_rows
        row_bad = np.zeros(n, dtype=bool)
        problems = []
        labels = np.zeros(n, dtype=np.float32)
        dense = np.zeros((n, len(self.dense_names)), dtype=np.float32)
        sparse = {}
        di = 0
        for c in self.columns:
            if c.kind == "skip":
                continue
            col = batch.column(c.name)
            if c.kind in ("label", "dense"):
                vals, bad = _parquet_numbers(col, required=c.kind == "label")
                for r in np.flatnonzero(bad & ~row_bad)[: MAX_BAD_LINES + 1]:
                    problems.append((int(r), c.name, f"expected a number, got {_show(col[int(r)])}"))
                row_bad |= bad
                if c.kind == "label":
                    row_bad |= _bad_labels(vals, row_bad, problems, c.name)
                if c.kind == "label":
                    labels = vals
                else:
                    dense[:, di] = vals
                    di += 1
            else:
                t = col.type
                if pa.types.is_list(t) or pa.types.is_large_list(t):
                    sparse[c.name] = _list_to_bags(col)
                elif pa.types.is_integer(t):
                    present = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                    ids = ints_to_ids(col.fill_null(0).to_numpy(zero_copy_only=False))
                    sparse[c.name] = (ids[present], _offsets_from_present(present))
                else:
                    col, long = _without_long_values(col)
                    for r in np.flatnonzero(long & ~row_bad)[: MAX_BAD_LINES + 1]:
                        problems.append((int(r), c.name, _value_problem(batch.column(c.name)[int(r)], False)))
                    row_bad |= long
                    if c.multi_sep:
                        sparse[c.name] = _split_multi(col, c.multi_sep)
                    else:
                        ids, present = strings_to_ids(col)
                        sparse[c.name] = (ids[present], _offsets_from_present(present))
        for r, name, reason in sorted(problems):
            self._bad(file_row + r + 1, name, reason)
        extra = int(row_bad.sum()) - len({r for r, _, _ in problems})
        self.stats.rows_bad += max(extra, 0)
        keep = ~row_bad
        if not keep.all():
            labels, dense = labels[keep], dense[keep]
            sparse = {k: _filter_bags(i, o, keep) for k, (i, o) in sparse.items()}
        if len(labels) == 0:
            return None
        return Chunk(first_row=first_row, labels=labels, dense=dense, sparse=sparse)


def _parquet_numbers(col: pa.Array, required: bool) -> tuple[np.ndarray, np.ndarray]:
    n = len(col)
    if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
        missing = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        vals = pc.cast(col.fill_null(0), pa.float64()).to_numpy(zero_copy_only=False).astype(np.float32)
        return vals, (missing if required else np.zeros(n, dtype=bool))
    s = pc.cast(col, pa.string()).fill_null("")
    empty = np.asarray(pc.equal(pc.utf8_length(s), 0).to_numpy(zero_copy_only=False), dtype=bool)
    ok = np.asarray(pc.match_substring_regex(s, _NUMBER_RE).to_numpy(zero_copy_only=False), dtype=bool)
    good = pc.if_else(pa.array(ok), s, pa.scalar("0"))
    vals = pc.cast(pc.utf8_trim_whitespace(good), pa.float64()).to_numpy(zero_copy_only=False).astype(np.float32)
    vals[~ok] = 0.0
    bad = ~ok & ~empty
    if required:
        bad |= empty
    return vals, bad


class LibsvmReader(Reader):
    """libsvm (`label idx:val ...`) and libfm (`label field:idx:val ...`) text.

    The ID of a token is its integer `idx`. Its feature (field) is, in this order: the
    `field_map` (dict name -> (lo, hi) inclusive index range, or a file with lines
    `name lo hi`), the libfm field number as written (`f<field>`), else the one feature `f`.
    Values are ignored for categorical fields; fields listed in `dense_fields` give dense
    columns instead (one per index in their range, value = the token's value).
    """

    fmt = "libsvm"

    def __init__(
        self,
        path: str,
        *,
        strict: bool = False,
        chunk_bytes: int = 16 << 20,
        progress: Progress | None = None,
        field_map: dict | str | None = None,
        dense_fields: list[str] | str | None = None,
        byte_range: tuple[int, int] | None = None,
        **_: object,
    ) -> None:
        super().__init__(path, strict=strict, chunk_bytes=chunk_bytes, progress=progress)
        self.source = _BlockSource(self.path, chunk_bytes, byte_range)
        body = [x for x in sample_lines(self.path) if x.strip()]
        if body and not any(libsvm_line(x, min_tokens=0) for x in body):
            desc, hint = guess_layout(body)
            raise TraceError(f"{self.path}: none of the first {len(body)} lines is libsvm/libfm text "
                             f"(label idx:value ...); the file looks like {desc}: try {hint}")
        self.ranges = _load_field_map(field_map, self.path) if field_map is not None else None
        self.map_name = os.fspath(field_map) if isinstance(field_map, (str, os.PathLike)) else "--field-map"
        self.unmapped = [0, 0]  # tokens in no field-map range, tokens in all (rows kept)
        self.first_unmapped: tuple[int, int] | None = None  # (line, index)
        for problem in _overlaps(self.ranges or []):
            if strict:
                raise TraceError(f"{self.map_name}: {problem}")
            self.warnings.append(f"{self.map_name}: {problem}")
        dense_set = set(dense_fields.split(",") if isinstance(dense_fields, str) else (dense_fields or []))
        self.label_name = "label"
        if self.ranges is not None:
            check_width(self.map_name, len(self.ranges), "fields")
            self.feature_names = [n for n, _, _ in self.ranges if n not in dense_set]
            self.dense_ranges = [(n, lo, hi) for n, lo, hi in self.ranges if n in dense_set]
            check_width(self.map_name, sum(hi - lo + 1 for _, lo, hi in self.dense_ranges), "dense columns")
            self.dense_names = [f"{n}_{i - lo}" for n, lo, hi in self.dense_ranges for i in range(lo, hi + 1)]
        else:
            self.dense_ranges = []
            self.feature_names = self._discover_fields()
            check_width(self.path, len(self.feature_names), "libfm fields")
        self.dense_ranges_arr = np.asarray([(lo, hi) for _, lo, hi in self.dense_ranges], dtype=np.int64).reshape(-1, 2)

    def _count_unmapped(self, field_of: np.ndarray, idx: np.ndarray, lines: np.ndarray) -> None:
        """Tokens no field-map range holds are dropped: an error under strict, else counted."""
        miss = np.flatnonzero(field_of < 0)
        self.unmapped[0] += len(miss)
        self.unmapped[1] += len(field_of)
        if len(miss) and self.first_unmapped is None:
            self.first_unmapped = (self._line(int(lines[miss[0]])), int(idx[miss[0]]))
            if self.strict:
                raise TraceError(f"{self.path}:{self.first_unmapped[0]}: index {self.first_unmapped[1]} is in no "
                                 f"range of {self.map_name}; extend the map")

    def _discover_fields(self) -> list[str]:
        for block, _ in _BlockSource(self.path, 1 << 20):
            for text in block.split(b"\n")[:1000]:
                parts = text.split()
                if len(parts) > 1:
                    return sorted({_libfm_field(p) for p in parts[1:]}, key=_natural)
        return ["f"]

    def __iter__(self) -> Iterator[Chunk]:
        first_row = 0
        for block, line in self.source:
            chunk = self._read_block(block, line, first_row)
            self._report(self.source.bytes_done)
            if chunk is None:
                continue
            first_row += chunk.rows
            self.stats.rows_ok += chunk.rows
            yield chunk
        lost, total = self.unmapped
        if lost:
            ln, idx = self.first_unmapped or (0, 0)
            self.warnings.append(
                f"{self.map_name}: {lost:,} of {total:,} tokens ({lost / total:.1%} of accesses) have an index in no "
                f"field-map range and were dropped (first: index {idx} at {self.path}:{ln}); extend the map")

    def _read_block(self, block: bytes, line: int, first_row: int) -> Chunk | None:
        raw_lines = block.split(b"\n")[:-1]
        line_no = np.arange(line, line + len(raw_lines), dtype=np.int64)
        arr = pa.array(raw_lines, pa.binary())
        try:
            arr = pc.cast(arr, pa.string())
        except pa.ArrowInvalid:
            arr = pa.array([x.decode("utf-8", "replace") for x in raw_lines], pa.string())
        arr = pc.utf8_trim_whitespace(arr)
        nonempty = np.asarray(pc.greater(pc.utf8_length(arr), 0).to_numpy(zero_copy_only=False), dtype=bool)
        arr, line_no = arr.filter(pa.array(nonempty)), line_no[nonempty]
        n = len(arr)
        if n == 0:
            return None
        tokens = pc.split_pattern_regex(arr, r"\s+")
        offs = tokens.offsets.to_numpy().astype(np.int64)
        flat = pc.list_flatten(tokens)
        first = offs[:-1]
        label_s = flat.take(pa.array(first))
        labels_ok = np.asarray(pc.match_substring_regex(label_s, _NUMBER_RE).to_numpy(zero_copy_only=False), bool)
        labels = (
            pc.cast(pc.if_else(pa.array(labels_ok), label_s, pa.scalar("0")), pa.float64())
            .to_numpy(zero_copy_only=False)
            .astype(np.float32)
        )
        labels[labels == -1] = 0  # libsvm's binary convention is -1/+1
        labels_num = labels_ok.copy()
        labels_ok &= (labels == 0) | (labels == 1)
        row_bad = ~labels_ok
        is_label = np.zeros(len(flat), dtype=bool)
        is_label[first] = True
        tok_row = np.repeat(np.arange(n), np.diff(offs))[~is_label]
        toks = flat.filter(pa.array(~is_label))
        parts = pc.split_pattern(toks, ":")
        nparts = np.diff(parts.offsets.to_numpy().astype(np.int64))
        tok_ok = (nparts == 2) | (nparts == 3)
        pflat = pc.list_flatten(parts)
        poff = parts.offsets.to_numpy().astype(np.int64)[:-1]
        has3 = nparts == 3
        idx_pos = np.where(has3, poff + 1, poff)
        val_pos = np.where(has3, poff + 2, poff + 1)
        safe = lambda p: pa.array(np.where(tok_ok, p, 0))  # noqa: E731 - a one-line helper
        idx_s = pflat.take(safe(idx_pos)) if len(pflat) else pa.array([], pa.string())
        val_s = pflat.take(safe(val_pos)) if len(pflat) else pa.array([], pa.string())
        idx_ok = np.asarray(pc.match_substring_regex(idx_s, r"^[0-9]{1,18}$").to_numpy(zero_copy_only=False), bool)
        val_ok = np.asarray(pc.match_substring_regex(val_s, _NUMBER_RE).to_numpy(zero_copy_only=False), bool)
        tok_ok &= idx_ok & val_ok
        if not tok_ok.all() or row_bad.any():
            items: dict[int, str] = {}
            for r in np.flatnonzero(~labels_ok)[: MAX_BAD_LINES + 1]:
                want = "a label 0 or 1 (or -1/+1)" if labels_num[r] else "a number"
                items[int(r)] = f"label: expected {want}, got {_show(label_s[int(r)])}"
            bad_tok = np.flatnonzero(~tok_ok)
            for t in bad_tok[: MAX_BAD_LINES + 1]:
                items.setdefault(int(tok_row[t]), f"expected idx:value or field:idx:value, got {_show(toks[int(t)])}")
            row_bad[tok_row[bad_tok]] = True
            for r in sorted(items):
                self._bad(int(line_no[r]), "", items[r])
            self.stats.rows_bad += int(row_bad.sum()) - len(items)
        idx = pc.cast(pc.if_else(pa.array(tok_ok), idx_s, pa.scalar("0")), pa.int64()).to_numpy(zero_copy_only=False)
        vals = pc.cast(pc.if_else(pa.array(tok_ok), val_s, pa.scalar("0")), pa.float64()).to_numpy(zero_copy_only=False)
        keep_tok = tok_ok & ~row_bad[tok_row]
        idx, vals, tok_row = idx[keep_tok], vals[keep_tok], tok_row[keep_tok]
        if self.ranges is not None:
            field_of = np.full(len(idx), -1, dtype=np.int64)
            for k, (_, lo, hi) in enumerate(self.ranges):
                field_of[(idx >= lo) & (idx <= hi)] = k
            names = [nm for nm, _, _ in self.ranges]
            self._count_unmapped(field_of, idx, line_no[tok_row])
        else:
            fld = pflat.take(pa.array(poff[keep_tok])) if len(poff) else pa.array([], pa.string())
            f3 = has3[keep_tok]
            fnames = np.where(f3, np.asarray(fld.to_pylist(), dtype=object), "") if f3.any() else None
            names = list(self.feature_names)
            if fnames is None:
                field_of = np.zeros(len(idx), dtype=np.int64) if names == ["f"] else np.full(len(idx), -1)
                if names != ["f"]:
                    names.append("f")
                    field_of[:] = len(names) - 1
            else:
                labels_f = np.where(f3, np.char.add("f", fnames.astype(str)), "f")
                uniq, inv = np.unique(labels_f, return_inverse=True)
                known = set(names)
                new = [u for u in uniq if u not in known]
                check_width(self.path, len(names) + len(new), "libfm fields")
                names.extend(new)
                pos = {nm: i for i, nm in enumerate(names)}
                field_of = np.asarray([pos[u] for u in uniq], dtype=np.int64)[inv]
            if names != self.feature_names:
                self.feature_names = names  # libfm fields found later in the file are added
        keep_rows = ~row_bad
        row_map = np.cumsum(keep_rows) - 1
        m = int(keep_rows.sum())
        if m == 0:
            return None
        dense = np.zeros((m, len(self.dense_names)), dtype=np.float32)
        col0 = 0
        dense_field_ids = set()
        for nm, lo, hi in self.dense_ranges:
            k = [x for x, _, _ in self.ranges].index(nm)
            dense_field_ids.add(k)
            sel = field_of == k
            dense[row_map[tok_row[sel]], col0 + idx[sel] - lo] = vals[sel]
            col0 += hi - lo + 1
        sparse = {}
        for k, nm in enumerate(names):
            if k in dense_field_ids or nm not in self.feature_names:
                continue
            sel = field_of == k
            rows_k = row_map[tok_row[sel]]
            counts = np.bincount(rows_k, minlength=m)
            off = np.zeros(m + 1, dtype=np.int64)
            np.cumsum(counts, out=off[1:])
            sparse[nm] = (idx[sel][np.argsort(rows_k, kind="stable")], off)
        for nm in self.feature_names:
            sparse.setdefault(nm, (np.zeros(0, np.int64), np.zeros(m + 1, np.int64)))
        return Chunk(first_row=first_row, labels=labels[keep_rows], dense=dense, sparse=sparse)


def _overlaps(ranges: list[tuple[str, int, int]]) -> list[str]:
    """Field-map ranges that share indices (a token there would go to the later field only)."""
    out = []
    ordered = sorted(ranges, key=lambda r: (r[1], r[2]))
    for (a, alo, ahi), (b, blo, bhi) in zip(ordered, ordered[1:]):
        if blo <= ahi:
            out.append(f"ranges of {a} ({alo}-{ahi}) and {b} ({blo}-{bhi}) overlap; every index belongs to one field")
    return out


def _libfm_field(token: bytes) -> str:
    parts = token.split(b":")
    return "f" + parts[0].decode("utf-8", "replace") if len(parts) == 3 else "f"


def _natural(name: str):
    digits = name.lstrip("f")
    return (0, int(digits)) if digits.isdigit() else (1, name)


def _load_field_map(field_map: dict | str, path: str) -> list[tuple[str, int, int]]:
    if isinstance(field_map, dict):
        items = [(str(k), int(v[0]), int(v[1])) for k, v in field_map.items()]
    else:
        fm = os.fspath(field_map)
        if not os.path.isfile(fm):
            raise TraceError(f"{fm}: field map not found")
        try:
            text = read_text(fm, "field map")  # bounded in size, any BOM
        except (OSError, ValueError) as exc:
            raise TraceError(str(exc)) from None
        items = []
        for i, line in enumerate(text.splitlines(), 1):
            parts = line.split()
            if not parts or parts[0].startswith("#"):
                continue
            if len(parts) != 3 or not all(_INDEX.fullmatch(x) for x in parts[1:]):
                raise TraceError(f"{fm}:{i}: expected 'name lo hi' (inclusive index range)")
            items.append((parts[0], int(parts[1]), int(parts[2])))
    if not items:
        raise TraceError(f"{path}: empty field map")
    where = fm if not isinstance(field_map, dict) else "--field-map"
    for name, lo, hi in items:
        if lo > hi:
            raise TraceError(f"{where}: field {name}: range {lo}-{hi} is empty (expected lo <= hi, inclusive)")
    names = [n for n, _, _ in items]
    counts = Counter(names)
    dup = next((n for n in names if counts[n] > 1), None)
    if dup:
        raise TraceError(f"{where}: field {dup} is named {counts[dup]} times")
    return items


# Options each format understands; any other one given is refused rather than ignored.
_TABLE_OPTIONS = {"label", "dense", "categorical", "multi_sep", "multi", "skip"}
FORMAT_OPTIONS = {
    "criteo": {"sep", "header"},
    "avazu": {"sep", "header", *_TABLE_OPTIONS},
    "csv": {"sep", "header", *_TABLE_OPTIONS},
    "parquet": set(_TABLE_OPTIONS),
    "libsvm": {"field_map", "dense_fields"},
}


def _check_options(fmt: str, opts: dict) -> None:
    for key in opts:
        if key not in FORMAT_OPTIONS[fmt]:
            fits = [f for f, keys in FORMAT_OPTIONS.items() if key in keys]
            raise TraceError(f"--{key.replace('_', '-')} does not apply to --format {fmt}"
                             + (f" (it applies to {', '.join(fits)})" if fits else ""))


def open_reader(
    path: str | os.PathLike,
    fmt: str,
    *,
    strict: bool = False,
    chunk_bytes: int = 16 << 20,
    progress: Progress | None = None,
    byte_range: tuple[int, int] | None = None,
    **format_options,
) -> Reader:
    """A streaming reader of `path` in format `fmt` (criteo|avazu|csv|parquet|libsvm); `byte_range`
    (plain text only) reads just the lines that start in it (see _BlockSource)."""
    fmt = fmt.lower()
    p = check_file(path)
    opts = {k: v for k, v in format_options.items() if v is not None}
    if fmt == "tsv":
        fmt = "csv"
        opts.setdefault("sep", "\t")
    if fmt == "libfm":
        fmt = "libsvm"
    if fmt in FORMAT_OPTIONS:
        _check_options(fmt, opts)
    if fmt in ("criteo", "avazu", "csv"):
        return DelimitedReader(p, fmt, strict=strict, chunk_bytes=chunk_bytes, progress=progress,
                               byte_range=byte_range, **opts)
    if fmt == "parquet":
        if byte_range is not None:
            raise TraceError(f"{p}: Parquet is read by row groups, not byte ranges")
        return ParquetReader(p, strict=strict, chunk_bytes=chunk_bytes, progress=progress, **opts)
    if fmt in ("libsvm", "libfm"):
        return LibsvmReader(p, strict=strict, chunk_bytes=chunk_bytes, progress=progress, byte_range=byte_range,
                            **opts)
    raise TraceError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
