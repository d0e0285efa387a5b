"""The fault notice: the one contract between the agent, which writes it on a pod whose RDMA
device failed (`rdmaplane.services.agent.faults`), and the in-pod library, which reads it
(`rdmaplane.train.notice`).

The notice is the pod annotation `rdmaplane.io/fault`; its value is one compact JSON object:

    {"class":"fatal","hca":"mlx5_3","port":1,"reason":"port 1 DOWN (DISABLED)",
     "since":"2026-11-30T13:00:00Z"}

`hca` and `port` name the faulty port (the worst fault hurting the pod), `class` is `fatal` or
`degraded`, `reason` says why, `since` is when the fault began (RFC 3339, UTC, as the API
writes times), and `held`, present only while the blast-radius breaker holds the action back,
says why. A notice is known by its fault (`notice_id`: HCA, port, class, since), not by its
wording. Readers ignore fields they do not know.

Training pods import this module (`rdmaplane.train`'s import contract allows it and nothing
else of ours): the standard library and the names only, nothing heavy at import.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import names

ANNOTATION = names.FAULT_ANNOTATION
# Where a pod finds its annotations: a downward-API volume the webhook mounts (its settings
# default to these), the file named by the variable, else the default.
ANNOTATIONS_DIR = "/etc/podinfo"
ANNOTATIONS_FILE_NAME = "annotations"
ANNOTATIONS_FILE = f"{ANNOTATIONS_DIR}/{ANNOTATIONS_FILE_NAME}"
ANNOTATIONS_FILE_ENV = "RDMAPLANE_ANNOTATIONS_FILE"


@dataclass(frozen=True, slots=True)
class Notice:
    hca: str
    port: int
    cls: str  # the document's `class`: fatal | degraded
    reason: str
    since: str  # RFC 3339, UTC (`rdmaplane.core.apitime.api_time`)
    held: str = ""  # why the breaker holds the action back; empty: it does not


def encode(notice: Notice) -> str:
    """The annotation's value: compact JSON, keys sorted; `held` only when set."""
    doc: dict[str, object] = {
        "hca": notice.hca,
        "port": notice.port,
        "class": notice.cls,
        "reason": notice.reason,
        "since": notice.since,
        **({"held": notice.held} if notice.held else {}),
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def decode(value: str) -> Notice:
    """The notice in an annotation's value; ValueError says what is wrong with it."""
    doc = json.loads(value)
    if not isinstance(doc, dict):
        raise ValueError(f"{ANNOTATION}: expected a JSON object, got {type(doc).__name__}")
    fields: dict[str, Any] = {}
    for key, field, kind in _FIELDS:
        got = doc.get(key, "" if key == "held" else None)
        if not isinstance(got, kind) or isinstance(got, bool):
            raise ValueError(f"{ANNOTATION}: {key!r} must be a {kind.__name__}, got {got!r}")
        fields[field] = got
    return Notice(**fields)


_FIELDS = (
    ("hca", "hca", str),
    ("port", "port", int),
    ("class", "cls", str),
    ("reason", "reason", str),
    ("since", "since", str),
    ("held", "held", str),
)


def document(value: str) -> dict[str, Any] | None:
    """What a lenient reader makes of any value: the JSON object; a value that is not JSON as
    its reason (`{"reason": value}`); None for JSON that is not an object."""
    try:
        doc = json.loads(value)
    except ValueError:
        return {"reason": value}
    return doc if isinstance(doc, dict) else None


def notice_id(value: str) -> str:
    """What makes a notice new: the fault's HCA, port, class and `since` (the agent rewrites
    the annotation when the faults hurting the pod change, not for a reworded reason); any
    other value is its own id."""
    try:
        fault = json.loads(value)
        return f"{fault['hca']}:{fault['port']} {fault['class']} since {fault['since']}"
    except (ValueError, TypeError, KeyError):
        return value
