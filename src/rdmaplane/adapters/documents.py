"""Reading YAML/JSON documents that a user or another machine handed us, safely.

Every file rdmaplane reads as a document (configs, pods, NRTs, GID dumps, snapshot sidecars)
goes through `read_document` or `parse_document`, so every one of them gives the same kind of
answer to hostile or careless input: a `DocumentError` whose one-line message names the file
and what is wrong with it, never a traceback. Guarded here: unreadable paths (missing,
a directory, no permission), files over a size bound, bytes that are not UTF-8 text, YAML/JSON
syntax errors, a key given twice in one mapping (YAML and JSON parsers keep the last, so a
typo'd copy would silently win), and nesting deeper than any real document (a parser or
validator would otherwise die of RecursionError). YAML aliases are shared, not expanded, so an
"alias bomb" costs no memory; the depth walk visits each shared container once.

Manifests as people keep them hold many objects: `manifest_objects` gives each one, with where
it is in the file, from every document of a stream and the items of a `kind: List`.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml

from rdmaplane.core.untrusted import DocumentError, printable, what_it_is

__all__ = [
    "MAX_BYTES",
    "MAX_DEPTH",
    "DocumentError",
    "check_depth",
    "decode",
    "expect_mapping",
    "manifest_objects",
    "parse_document",
    "parse_documents",
    "printable",
    "read_document",
    "read_documents",
    "read_text",
    "source_name",
]

# Far above any real config, pod or NRT (a Pod nests about 12 deep), far below Python's limit.
MAX_DEPTH = 64
# Pods and NRTs of 8-GPU nodes are tens of KiB; GID dumps of big nodes a few MiB.
MAX_BYTES = 64 * 1024 * 1024

T = TypeVar("T")


STDIN = "-"


def source_name(path: str | Path) -> str:
    """How messages name a file: `-` is standard input."""
    return "standard input" if str(path) == STDIN else str(path)


def read_document(path: str | Path, *, max_bytes: int = MAX_BYTES) -> object:
    """The parsed content of the YAML or JSON file at `path` (None for an empty file); `-` is
    standard input."""
    return parse_document(read_text(path, max_bytes=max_bytes), source_name(path))


def read_text(path: str | Path, *, max_bytes: int = MAX_BYTES) -> str:
    """The file's text (`-`: standard input's), or a `DocumentError` saying why it cannot be
    had."""
    name = source_name(path)
    try:
        if str(path) == STDIN:
            data = sys.stdin.buffer.read(max_bytes + 1)
        else:
            with Path(path).open("rb") as f:
                data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise DocumentError(f"{name}: is a directory, not a file") from None
    except OSError as e:
        raise DocumentError(f"{name}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise DocumentError(f"{name}: larger than {max_bytes} bytes; refusing to read it")
    return decode(data, name)


def decode(data: bytes, source: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DocumentError(
            f"{source}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset {e.start}); "
            "is this the right file?"
        ) from None


def parse_document(text: str, source: str) -> object:
    """YAML (a superset of the JSON we read) parsed, with the depth bound checked."""
    doc = _parsed(text, source, _load_one)
    check_depth(doc, source)
    return doc


def read_documents(path: str | Path, *, max_bytes: int = MAX_BYTES) -> list[object]:
    """Every document of a YAML stream (`---` between them, as `kubectl get -o yaml` of several
    objects or a hand-joined file gives), empty ones left out; JSON is one document. `-` is
    standard input."""
    return parse_documents(read_text(path, max_bytes=max_bytes), source_name(path))


def parse_documents(text: str, source: str) -> list[object]:
    docs = _parsed(text, source, _load_all)
    for doc in docs:
        check_depth(doc, source)
    return docs


_NOT_JSON = object()


class _DuplicateKey(ValueError):
    pass


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def _json(text: str) -> object:
    """The JSON document, or `_NOT_JSON` (flow-style YAML also starts with { or [)."""
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text, object_pairs_hook=_unique_pairs)
        except json.JSONDecodeError:
            pass
    return _NOT_JSON


# libyaml's parser when PyYAML has it (a 50 MB annotation: 0.5 s instead of 11 s), the same
# safe constructor either way.
_BaseLoader: type[yaml.SafeLoader] = (
    yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader  # type: ignore[assignment]
)


class _Loader(_BaseLoader):  # type: ignore[valid-type, misc]
    """PyYAML's safe loader, refusing a key given twice in one mapping (keys merged in with
    `<<` may be overridden: that is what a merge is for)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # an unhashable key: the base constructor says so
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"key {key!r} given twice (first on line {first})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
        mapping: dict[Any, Any] = super().construct_mapping(node, deep)
        return mapping


def _load_one(text: str) -> object:
    doc = _json(text)
    return yaml.load(text, Loader=_Loader) if doc is _NOT_JSON else doc


def _load_all(text: str) -> list[object]:
    doc = _json(text)
    docs = yaml.load_all(text, Loader=_Loader) if doc is _NOT_JSON else [doc]
    return [d for d in docs if d is not None]


def _parsed(text: str, source: str, load: Callable[[str], T]) -> T:
    """`load(text)`, with every way a parser can fail on hostile text turned into one line."""
    if "\0" in text:
        raise DocumentError(f"{source}: contains NUL bytes; not a YAML or JSON document")
    try:
        return load(text)
    except _DuplicateKey as e:
        raise DocumentError(f"{source}: not valid JSON: key {e.args[0]!r} given twice") from None
    except RecursionError:
        raise DocumentError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.MarkedYAMLError as e:
        if "maximum nesting depth" in str(e.problem):  # libyaml's own bound (1000)
            raise DocumentError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
        mark = e.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise DocumentError(f"{source}: not valid YAML/JSON: {where}{e.problem}") from None
    except yaml.YAMLError as e:
        raise DocumentError(f"{source}: not valid YAML/JSON: {e}") from None


def check_depth(doc: object, source: str, limit: int = MAX_DEPTH) -> None:
    """Raise `DocumentError` when containers nest deeper than `limit` (iterative, so the check
    itself cannot overflow; shared containers from YAML aliases are visited once)."""
    seen: set[int] = set()
    stack: list[tuple[object, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if not isinstance(node, dict | list) or id(node) in seen:
            continue
        if depth > limit:
            raise DocumentError(f"{source}: nested deeper than {limit} levels")
        seen.add(id(node))
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children)


def expect_mapping(doc: object, source: str, what: str = "a mapping") -> dict[str, object]:
    """`doc` when it is a mapping (an empty document counts as an empty one)."""
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise DocumentError(f"{source}: expected {what} at the top level, got {what_it_is(doc)}")
    return doc


def manifest_objects(
    docs: list[object], source: str, *, bare_lists: bool = True
) -> list[tuple[str, object]]:
    """(where, object) for every object of a manifest: each document of a stream, each item
    of a `kind: List` (and of a bare YAML list, unless `bare_lists` is off), in file order;
    `where` says which (`FILE: document 2, items[0]`)."""
    out: list[tuple[str, object]] = []
    for i, doc in enumerate(docs):
        items: object = None
        if isinstance(doc, dict) and _is_list(doc):
            items = doc["items"]
        elif isinstance(doc, list) and bare_lists:
            items = doc
        at = f"{source}: document {i + 1}" if len(docs) > 1 else source
        if isinstance(items, list):
            out += [(f"{at}, items[{j}]", obj) for j, obj in enumerate(items)]
        else:
            out.append((at, doc))
    return out


def _is_list(doc: dict[str, object]) -> bool:
    """`kind: List` or `kind: FooList` (kubectl get -o yaml), or a kind-less object of items."""
    kind = doc.get("kind")
    return isinstance(doc.get("items"), list) and (
        kind is None or (isinstance(kind, str) and kind.endswith("List"))
    )
