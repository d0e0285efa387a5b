"""JSON Pointer (RFC 6901) and JSON Patch (RFC 6902) `add` operations, built against a working
copy of the document that follows them. Pure, and about no document in particular: the
webhook's patch (`services.webhook.policy.inject`) and the pointers that name a workload's pod
templates (`core.workloads`) use it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Json = Any  # a decoded JSON value
Path = tuple[str | int, ...]  # the reference tokens of a pointer, unescaped


def escape(token: str) -> str:
    """One RFC 6901 reference token: `~` → `~0`, `/` → `~1` (`rdmaplane.io/hca`)."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(*tokens: str | int) -> str:
    """The JSON Pointer of `tokens` (`pointer("a/b", 0)` is `/a~1b/0`; none: the whole)."""
    return "".join("/" + escape(str(t)) for t in tokens)


def copy_json(value: Json) -> Json:
    """A deep copy of a decoded JSON value (dicts and lists copied, the rest shared)."""
    if isinstance(value, dict):
        return {k: copy_json(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_json(v) for v in value]
    return value


class PatchBuilder:
    """Emits `add` operations against a working copy that follows them, so each operation is
    built from the object as it stands at that point (as the API server applies them). Never
    replaces what is there: every operation adds a key or a list item that was not."""

    def __init__(self, obj: Mapping[str, Json]) -> None:
        self.obj: dict[str, Json] = copy_json(obj)
        self.ops: list[dict[str, Json]] = []

    def ensure(self, path: Path, value: Json) -> None:
        """Set the key at `path` to `value` unless it exists; missing parents are added whole
        (one operation), existing ones are never replaced."""
        node: Json = self.obj
        for i, token in enumerate(path[:-1]):
            child = _child(node, token)
            if child is None:  # absent, or JSON null: an add replaces a null member
                return self._add(path[: i + 1], node, token, _nest(path[i + 1 :], value))
            node = child
        if _child(node, path[-1]) is None:
            self._add(path, node, path[-1], value)

    def insert(self, path: Path, item: Json, index: int | None = None) -> None:
        """Insert `item` at `index` (None: the end) of the list at `path`, made when missing."""
        node: Json = self.obj
        for token in path:
            node = _child(node, token)
        if not isinstance(node, list):
            return self.ensure(path, [item])
        self.ops.append(
            {
                "op": "add",
                "path": pointer(*path, "-" if index is None else index),
                "value": copy_json(item),
            }
        )
        node.insert(len(node) if index is None else index, copy_json(item))

    def remove(self, path: Path) -> None:
        """Remove the key at `path` (it must be there)."""
        node: Json = self.obj
        for token in path[:-1]:
            node = _child(node, token)
        self.ops.append({"op": "remove", "path": pointer(*path)})
        del node[path[-1]]

    def _add(self, path: Path, parent: Json, key: str | int, value: Json) -> None:
        self.ops.append({"op": "add", "path": pointer(*path), "value": copy_json(value)})
        parent[key] = copy_json(value)


def _child(node: Json, token: str | int) -> Json:
    if isinstance(node, list) and isinstance(token, int):
        return node[token] if token < len(node) else None
    return node.get(token) if isinstance(node, dict) else None


def _nest(path: Path, value: Json) -> Json:
    for token in reversed(path):
        value = {token: value}
    return value
