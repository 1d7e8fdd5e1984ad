"""What a file that should be text looks like when it is not: a known binary format by its
magic number, or binary bytes. Checked on the first 64 KiB only, so a huge binary file
without a newline is never read whole."""

from __future__ import annotations

import zlib

from foundation.text import transcoded
from traces.errors import TraceError

HEAD_BYTES = 1 << 16
GZIP = b"\x1f\x8b"
MAGIC = (  # (leading bytes, what the file is)
    (b"PAR1", "a Parquet file"),
    (b"\x7fELF", "an ELF executable"),
    (b"\x93NUMPY", "a NumPy .npy array"),
    (b"PK\x03\x04", "a zip archive (.zip, .npz)"),
    (b"PK\x05\x06", "an empty zip archive"),
    (b"\x89PNG", "a PNG image"),
    (b"%PDF", "a PDF document"),
    (b"BZh", "a bzip2 file (decompress it first)"),
    (b"\xfd7zXZ\x00", "an xz file (decompress it first)"),
    (b"\x28\xb5\x2f\xfd", "a zstd file (decompress it first)"),
    (b"\x89HDF", "an HDF5 file"),
    (b"SQLite format 3", "an SQLite database"),
)
TEXT_CONTROLS = {9, 10, 12, 13}  # tab, newline, form feed, carriage return


def known_format(head: bytes) -> str | None:
    for magic, what in MAGIC:
        if head.startswith(magic):
            return what
    return None


def looks_binary(head: bytes) -> bool:
    """NUL bytes, or more than 5% control bytes or undecodable UTF-8 in `head`."""
    if not head:
        return False
    if b"\0" in head:
        return True
    text = head.decode("utf-8", "replace")
    odd = sum(1 for c in text if c == "\ufffd" or (ord(c) < 32 and ord(c) not in TEXT_CONTROLS))
    return odd > 0.05 * len(text)


def text_head(path: str) -> bytes:
    """The first bytes of `path` as UTF-8 text (decompressed when gzip); TraceError naming the file and
    what it looks like when it is not text."""
    try:
        with open(path, "rb") as f:
            head = f.read(HEAD_BYTES)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read ({exc.strerror})") from None
    what = known_format(head)
    if what == "a Parquet file":
        raise TraceError(f"{path}: this is a Parquet file, not text: try --format parquet")
    inside = ""
    if head.startswith(GZIP):
        try:  # the stream's start only: a file cut short still has a readable head
            head = zlib.decompressobj(16 + zlib.MAX_WBITS).decompress(head, HEAD_BYTES)
        except zlib.error as exc:
            raise TraceError(f"{path}: cannot read (a damaged gzip stream: {exc})") from None
        what, inside = known_format(head), " inside its gzip stream"
    if what:
        raise TraceError(f"{path}: this is {what}{inside}, not text: check the file and --format")
    head = b"".join(transcoded([head]))  # text a BOM says is UTF-16/32 is judged as what it reads as
    if looks_binary(head):
        raise TraceError(f"{path}: binary data{inside}, not text: check the file and --format")
    return head
