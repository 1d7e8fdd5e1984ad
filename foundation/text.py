"""The one rule for decoding text someone else wrote: the encoding its byte-order mark names, else UTF-8.

Windows tools write a BOM: Notepad saves UTF-8 with one, PowerShell's `Out-File` and `>` write
UTF-16 LE with one, other tools UTF-16 BE or UTF-32. Every document (specs, plans, profiles,
manifests) and every text data reader decodes through here, so all of them read the same files.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable, Iterator

# UTF-32 LE first: its BOM starts with UTF-16 LE's two bytes
BOMS: tuple[tuple[bytes, str], ...] = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)
LONGEST_BOM = max(len(b) for b, _ in BOMS)


class NotText(ValueError):
    """Bytes that are not text in the file's encoding (one line naming the file and the offset)."""


def sniff(head: bytes) -> tuple[str, int]:
    """(codec, length of its BOM) of text that starts with `head`; UTF-8 when no BOM names one."""
    for bom, codec in BOMS:
        if head.startswith(bom):
            return codec, len(bom)
    return "utf-8", 0


def decode(raw: bytes, where: str, what: str = "file") -> str:
    """`raw` as text under the BOM rule; NotText naming `where`, the encoding and the byte's offset."""
    codec, skip = sniff(raw)
    try:
        return raw[skip:].decode(codec)
    except UnicodeDecodeError as exc:
        at = skip + exc.start
        raise NotText(f"{where}: {what} is not {codec.upper()} text (byte 0x{raw[at]:02x} at offset {at})") from None


def transcoded(blocks: Iterable[bytes]) -> Iterator[bytes]:
    """Blocks of a text stream as UTF-8 blocks, the BOM removed (a stream without one passes
    unchanged: its bytes, valid or not, are the data readers' to judge). Bytes that are not text
    in the BOM's encoding become U+FFFD, which no number or hash parses: that row is malformed."""
    it = iter(blocks)
    head = b""
    for block in it:  # enough bytes to see the longest BOM, or the end of the stream
        head += block
        if len(head) >= LONGEST_BOM:
            break
    codec, skip = sniff(head)
    if codec == "utf-8":
        if head[skip:]:
            yield head[skip:]
        yield from it
        return
    decoder = codecs.getincrementaldecoder(codec)(errors="replace")
    for block in _chain(head[skip:], it):
        out = decoder.decode(block)
        if out:
            yield out.encode("utf-8")
    tail = decoder.decode(b"", final=True)  # an odd byte at the end: one U+FFFD
    if tail:
        yield tail.encode("utf-8")


def _chain(first: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if first:
        yield first
    yield from rest
