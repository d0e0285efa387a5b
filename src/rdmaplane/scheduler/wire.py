"""The upstream scheduler-extender JSON (k8s.io/kube-scheduler/extender/v1): Go field names,
capitalised, no JSON tags. Read by the model layer (`rdmaplane.decoding`) straight from the
request bytes into typed structs (5,000 node names per call, the Pod as the extender reads it:
`placement.Pod`), naming the bad field on malformed input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from operator import getitem, itemgetter
from typing import Any

import msgspec
import orjson

from rdmaplane.decoding import DecodeError, Decoder, convert
from rdmaplane.errors import InputError
from rdmaplane.scheduler.placement import MAX_SCORE, Pod

MAX_HOSTS_KEPT = 100_000  # hosts whose priority entries are kept encoded


class WireError(InputError):
    """Malformed request (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    pod: Pod
    node_names: list[str]
    nodes: dict[str, Any] | None  # the NodeList when the scheduler is not nodeCacheCapable


class _Args(msgspec.Struct, frozen=True, rename="pascal"):
    pod: Pod
    node_names: list[str] | None = None
    nodes: dict[str, Any] | None = None


class _NodeMeta(msgspec.Struct, frozen=True):
    name: str


class _Node(msgspec.Struct, frozen=True):
    metadata: _NodeMeta


class _NodeList(msgspec.Struct, frozen=True):
    items: tuple[_Node, ...] | None = None


_ARGS = Decoder(_Args)


def parse_args(body: bytes) -> ExtenderArgs:
    try:
        args: _Args = _ARGS.decode(body)
    except DecodeError as exc:
        if not exc.path:
            raise WireError(
                "request body: expected a JSON object with Pod and NodeNames or Nodes"
            ) from None
        raise WireError(str(exc)) from None
    except msgspec.DecodeError as exc:
        raise WireError(f"request body is not valid JSON: {exc}") from None
    if args.node_names is not None:
        return ExtenderArgs(args.pod, args.node_names, None)
    if args.nodes is None:
        return ExtenderArgs(args.pod, [], None)
    try:
        listed = convert(args.nodes, _NodeList, "Nodes")
    except DecodeError as exc:
        raise WireError(str(exc)) from None
    return ExtenderArgs(args.pod, [n.metadata.name for n in listed.items or ()], args.nodes)


def filter_result(
    args: ExtenderArgs,
    passed: list[str],
    failed: dict[str, str],
    unresolvable: dict[str, str],
    error: str = "",
) -> bytes:
    nodes = None
    if args.nodes is not None:
        keep = set(passed)
        items = [n for n in args.nodes.get("items") or [] if n["metadata"]["name"] in keep]
        nodes = {**args.nodes, "items": items}
    return orjson.dumps(
        {
            "Nodes": nodes,
            "NodeNames": passed,
            "FailedNodes": failed,
            "FailedAndUnresolvableNodes": unresolvable,
            "Error": error,
        }
    )


_ENTRIES: dict[str, tuple[bytes, ...]] = {}  # host → its entry for each score, encoded


def priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """`[{"Host": …, "Score": …}]`, encoded. kube-scheduler asks about the same hundreds of
    nodes on every call, and scores are 0..MAX_SCORE: each host's entries are encoded once and
    kept, so a reply is a lookup per host and a join, in C."""
    if len(hosts) != len(scores):
        raise ValueError(f"{len(hosts)} hosts, {len(scores)} scores")
    if not hosts:
        return b"[]"
    if min(scores) < 0 or max(scores) > MAX_SCORE:
        return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])
    pick = itemgetter(*hosts)
    try:
        found = pick(_ENTRIES)
    except KeyError:
        if len(_ENTRIES) + len(hosts) > MAX_HOSTS_KEPT:
            _ENTRIES.clear()
        for host in hosts:
            if host not in _ENTRIES:
                _ENTRIES[host] = _entries(host)
        found = pick(_ENTRIES)
    rows = map(getitem, found if len(hosts) > 1 else (found,), scores)
    return b"[" + b",".join(rows) + b"]"


def _entries(host: str) -> tuple[bytes, ...]:
    head = b'{"Host":' + orjson.dumps(host) + b',"Score":'
    return tuple(head + b"%d}" % score for score in range(MAX_SCORE + 1))
