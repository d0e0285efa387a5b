"""The upstream scheduler-extender JSON (k8s.io/kube-scheduler/extender/v1): Go field names,
capitalised, no JSON tags. Read by the model layer (`rdmaplane.core.decoding`) straight from the
request bytes into typed structs (5,000 node names per call, the Pod as the extender reads it:
`rdmaplane.core.pod.Pod`), naming the bad field on malformed input."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import orjson

from rdmaplane.core.decoding import DecodeError, Decoder, convert
from rdmaplane.core.errors import InputError
from rdmaplane.core.pod import Pod


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


_ENTRY = '{"Host":"%s","Score":%d}'.__mod__


def priorities(hosts: Sequence[str], scores: Sequence[int]) -> bytes:
    """`[{"Host": …, "Score": …}]`, encoded. Node names need no JSON escaping (they are DNS
    subdomains), so a reply is one C-level format per host over the strings just decoded.
    Encodings kept per host cost more in a busy cluster: looking 500 of them up in a dict missed
    the CPU caches that kube-scheduler's own work had just emptied (4× slower than warm)."""
    if len(hosts) != len(scores):
        raise ValueError(f"{len(hosts)} hosts, {len(scores)} scores")
    joined = "".join(hosts)
    if '"' in joined or "\\" in joined or not joined.isprintable():
        return orjson.dumps([{"Host": h, "Score": s} for h, s in zip(hosts, scores, strict=True)])
    return ("[" + ",".join(map(_ENTRY, zip(hosts, scores, strict=True))) + "]").encode()
