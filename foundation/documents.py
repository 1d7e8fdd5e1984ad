"""Reading a document someone else wrote (a plan, profile, manifest, model or hardware spec, run
result, timeline): what it may cost is bounded before and while it is parsed, and each refusal is
one line naming the file.

- size: refused by its size before it is read (MAX_DOC_BYTES; YAML, parsed in pure Python, MAX_YAML_BYTES);
- text: decoded by foundation.text's rule (the encoding a BOM names, else UTF-8);
- nesting: at most MAX_DEPTH lists or mappings deep, checked without recursion, so no later walk
  of the value (a copy, a dump) can overflow the stack either;
- numbers: an integer longer than Python converts is refused, not an anonymous ValueError;
- keys: a key written twice in one mapping (JSON object) is refused; parsers keep the last silently;
- YAML: plain data only (mappings, lists, strings, numbers, booleans, null): another tag is refused,
  and aliases may neither refer to the node that holds them nor expand the document past
  MAX_YAML_NODES values (a "billion laughs" file of a few hundred bytes is refused unexpanded).
JSON and YAML syntax errors keep their parser's exception (json.JSONDecodeError, yaml.YAMLError):
callers name the line in their own words.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from foundation.files import regular_file
from foundation.text import decode

MAX_DOC_BYTES = 64 << 20  # a plan, profile summary or manifest: the largest real ones are a few MB
MAX_YAML_BYTES = 4 << 20  # a spec of 20,000 tables is 3 MB; PyYAML parses about 0.3 MB a second
MAX_DEPTH = 64  # lists or mappings inside each other; real documents nest a handful
MAX_YAML_NODES = 1 << 21  # values of a YAML document with its aliases expanded (an alias-free 4 MB holds fewer)


class DocumentError(ValueError):
    """A document that is not plain data of a bounded cost; str() names the file."""


class DocumentTooLarge(DocumentError):
    """A document beyond what any real one costs (size, nesting, alias expansion)."""


def read_bytes(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (MAX_DOC_BYTES), checked by its size
    before it is read."""
    limit = MAX_DOC_BYTES if max_bytes is None else max_bytes
    path = regular_file(path, what)
    size = path.stat().st_size
    if size > limit:
        raise DocumentTooLarge(f"{path}: {what} of {size:,} bytes, more than any real one ({limit:,} at most)")
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)  # the file may grow after the size check
    except OSError as exc:
        raise OSError(f"{path}: cannot read {what} ({exc.strerror})") from None
    if len(raw) > limit:
        raise DocumentTooLarge(f"{path}: {what} grew past {limit:,} bytes while read")
    return raw


def read_text(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> str:
    """The text of a small file (bounded as read_bytes), decoded by the BOM rule."""
    return decode(read_bytes(path, what, max_bytes), str(path), what)


def read_json(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> object:
    """The parsed JSON of a regular file, bounded in size, nesting and number length."""
    text = read_text(path, what, max_bytes)
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except DuplicateKey as exc:
        raise DocumentError(f"{path}: {what} has the key {exc.key!r} twice in one object") from None
    except RecursionError:
        raise _too_deep(path, what) from None
    except json.JSONDecodeError:
        raise
    except ValueError:  # the only other: an integer of more digits than int() converts
        raise _long_number(path, what) from None
    check_depth(doc, path, what)
    return doc


class DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """An object's members as a dict; a name given twice is refused (json keeps the last silently)."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        raise DuplicateKey(next(k for k, _ in pairs if k in seen or seen.add(k)))
    return out


def read_yaml(path: str | os.PathLike, what: str, max_bytes: int | None = None) -> object:
    """The parsed YAML of a regular file: plain data only, bounded in size, nesting, aliases and
    number length."""
    import yaml

    from foundation.yaml_loader import BoundedLoader, YamlRefused

    text = read_text(path, what, MAX_YAML_BYTES if max_bytes is None else max_bytes)
    loader = BoundedLoader(text, max_depth=MAX_DEPTH, max_nodes=MAX_YAML_NODES)
    try:
        return loader.get_single_data()
    except YamlRefused as exc:
        cls = DocumentTooLarge if exc.too_large else DocumentError
        raise cls(f"{path}: {what} {exc}") from None
    except RecursionError:
        raise _too_deep(path, what) from None
    except yaml.YAMLError:
        raise
    except ValueError:  # int() of a number of more digits than it converts
        raise _long_number(path, what) from None
    finally:
        loader.dispose()


def read_spec(path: str | os.PathLike, what: str) -> object:
    """A spec a user writes in either syntax: JSON for a `.json` file (any case), else YAML."""
    return (read_json if Path(path).suffix.lower() == ".json" else read_yaml)(path, what)


def check_depth(doc: object, path: str | os.PathLike, what: str) -> None:
    """Refuse lists or mappings nested deeper than MAX_DEPTH (an explicit stack: no recursion)."""
    stack = [(doc, 1)]
    while stack:
        value, depth = stack.pop()
        children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else None
        if children is None:
            continue
        if depth > MAX_DEPTH:
            raise _too_deep(path, what)
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def _too_deep(path: str | os.PathLike, what: str) -> DocumentTooLarge:
    return DocumentTooLarge(f"{Path(path)}: {what} nests lists or objects deeper than any real one "
                            f"({MAX_DEPTH} levels at most)")


def _long_number(path: str | os.PathLike, what: str) -> DocumentError:
    return DocumentError(f"{Path(path)}: {what} holds an integer of more than {sys.get_int_max_str_digits():,} "
                         "digits, more than any real one")
