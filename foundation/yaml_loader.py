"""PyYAML's safe loader held to plain data of a bounded cost (see foundation.documents).

SafeLoader already refuses Python objects, but it still builds dates, sets and bytes from their
tags, composes nodes as deep as the stack allows, and lets aliases share nodes: a few hundred bytes
of nested aliases make a value whose every copy or dump is exponential, and an alias inside its
own anchor makes a value that holds itself. Here the composer counts depth as it descends, the
composed node graph is measured once (each shared node once, so the check is linear in the file)
before anything is constructed, and only the tags of JSON's types pass.
"""

from __future__ import annotations

import yaml
from yaml.events import AliasEvent, CollectionStartEvent, ScalarEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

_CORE = "tag:yaml.org,2002:"
PLAIN_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "seq", "map"))


class YamlRefused(ValueError):
    """What the loader refused, worded to follow the file's name and what it is."""

    def __init__(self, message: str, too_large: bool) -> None:
        super().__init__(message)
        self.too_large = too_large


class BoundedLoader(yaml.SafeLoader):
    def __init__(self, stream: str, max_depth: int, max_nodes: int) -> None:
        super().__init__(stream)
        self.max_depth, self.max_nodes = max_depth, max_nodes
        self._depth = 0

    def compose_node(self, parent: Node | None, index: object) -> Node:
        event = self.peek_event()
        line = event.start_mark.line + 1
        if isinstance(event, (ScalarEvent, CollectionStartEvent)) and event.tag not in (None, "!"):
            if event.tag not in PLAIN_TAGS:
                raise YamlRefused(f"has the tag {_written(event.tag)} at line {line}; only plain data (mappings, lists, "
                                  "strings, numbers, true/false, null) is read", too_large=False)
        if isinstance(event, AliasEvent):
            return super().compose_node(parent, index)
        self._depth += 1
        try:
            if self._depth > self.max_depth:
                raise YamlRefused(f"nests lists or mappings deeper than any real one ({self.max_depth} levels at "
                                  f"most; line {line})", too_large=True)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def get_single_data(self) -> object:
        node = self.get_single_node()
        if node is None:
            return None
        for n in _walk(node):  # resolved implicitly: a date or a set written without a tag
            if n.tag not in PLAIN_TAGS and n.tag != _CORE + "merge":
                raise YamlRefused(f"has a {n.tag.removeprefix(_CORE)} value at line {n.start_mark.line + 1}; "
                                  "only plain data is read (quote it to make it a string)", too_large=False)
            if isinstance(n, MappingNode):
                _check_unique_keys(n)
        _check_expansion(node, self.max_nodes)
        return self.construct_document(node)


def _check_unique_keys(node: MappingNode) -> None:
    """A key written twice in one mapping: PyYAML keeps the last silently (the first is what a reader
    of the file sees)."""
    first: dict[tuple[str, str], int] = {}
    for key, _ in node.value:
        if not isinstance(key, ScalarNode) or key.tag == _CORE + "merge":
            continue
        line = key.start_mark.line + 1
        seen = first.setdefault((key.tag, key.value), line)
        if seen != line:
            raise YamlRefused(f"has the key {key.value!r} twice in one mapping (lines {seen} and {line})",
                              too_large=False)


def _written(tag: str) -> str:
    """A tag as a YAML file writes it: `!!binary`, not `tag:yaml.org,2002:binary`."""
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


def _children(node: Node) -> list[Node]:
    if isinstance(node, SequenceNode):
        return list(node.value)
    if isinstance(node, MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _walk(root: Node):
    """Every distinct node once (shared nodes and cycles included), without recursion."""
    seen, stack = {id(root)}, [root]
    while stack:
        node = stack.pop()
        yield node
        for c in _children(node):
            if id(c) not in seen:
                seen.add(id(c))
                stack.append(c)


def _check_expansion(root: Node, limit: int) -> None:
    """The values the document holds once every alias is replaced by a copy of its anchor: at most
    `limit`, and finite (no alias inside its own anchor). A post-order walk that sizes each
    distinct node once; a node met again while still open is its own ancestor."""
    size: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, closing = stack.pop()
        key = id(node)
        if closing:
            open_nodes.discard(key)
            total = 1 + sum(size[id(c)] for c in _children(node))
            if total > limit:
                raise YamlRefused(f"expands past {limit:,} values through its aliases (line "
                                  f"{node.start_mark.line + 1}), more than any real one", too_large=True)
            size[key] = total
            continue
        if key in size:
            continue
        if key in open_nodes:
            raise YamlRefused(f"has an alias inside its own anchor (line {node.start_mark.line + 1}): "
                              "a value that holds itself", too_large=False)
        open_nodes.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
