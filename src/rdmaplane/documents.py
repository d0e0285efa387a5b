"""Reading YAML/JSON documents that a user or another machine handed us, safely.

Every file rdmaplane reads as a document (configs, pods, NRTs, GID dumps, snapshot sidecars)
goes through `read_document` or `parse_document`, so every one of them gives the same kind of
answer to hostile or careless input: a `DocumentError` whose one-line message names the file
and what is wrong with it, never a traceback. Guarded here: unreadable paths (missing,
a directory, no permission), files over a size bound, bytes that are not UTF-8 text, YAML/JSON
syntax errors, and nesting deeper than any real document (a parser or validator would
otherwise die of RecursionError). YAML aliases are shared, not expanded, so an "alias bomb"
costs no memory; the depth walk visits each shared container once.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

# Far above any real config, pod or NRT (a Pod nests about 12 deep), far below Python's limit.
MAX_DEPTH = 64
# Pods and NRTs of 8-GPU nodes are tens of KiB; GID dumps of big nodes a few MiB.
MAX_BYTES = 64 * 1024 * 1024


class DocumentError(ValueError):
    """A document that cannot be used; the message names the source and the problem."""


def read_document(path: str | Path, *, max_bytes: int = MAX_BYTES) -> object:
    """The parsed content of the YAML or JSON file at `path` (None for an empty file)."""
    return parse_document(read_text(path, max_bytes=max_bytes), str(path))


def read_text(path: str | Path, *, max_bytes: int = MAX_BYTES) -> str:
    """The file's text, or a `DocumentError` saying why it cannot be had."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise DocumentError(f"{path}: is a directory, not a file") from None
    except OSError as e:
        raise DocumentError(f"{path}: cannot read: {e.strerror or e}") from None
    if len(data) > max_bytes:
        raise DocumentError(f"{path}: larger than {max_bytes} bytes; refusing to read it")
    return decode(data, str(path))


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
    if "\0" in text:
        raise DocumentError(f"{source}: contains NUL bytes; not a YAML or JSON document")
    try:
        if text.lstrip().startswith(("{", "[")):
            try:
                doc: object = json.loads(text)
            except json.JSONDecodeError:
                doc = yaml.safe_load(text)  # flow-style YAML also starts with { or [
        else:
            doc = yaml.safe_load(text)
    except RecursionError:
        raise DocumentError(f"{source}: nested deeper than {MAX_DEPTH} levels") from None
    except yaml.MarkedYAMLError as e:
        where = (
            f"line {e.problem_mark.line + 1}, column {e.problem_mark.column + 1}: "
            if (e.problem_mark)
            else ""
        )
        raise DocumentError(f"{source}: not valid YAML/JSON: {where}{e.problem}") from None
    except yaml.YAMLError as e:
        raise DocumentError(f"{source}: not valid YAML/JSON: {e}") from None
    check_depth(doc, source)
    return doc


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
        raise DocumentError(f"{source}: expected {what} at the top level, got {_kind(doc)}")
    return doc


def _kind(doc: object) -> str:
    return {
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
        bool: "a boolean",
    }.get(type(doc), type(doc).__name__)
