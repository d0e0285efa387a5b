"""What the driver has prepared, on disk, so that a restarted driver prepares nothing twice.

One JSON file in the plugin folder: per claim UID its state, the answer given to the kubelet and
the CDI spec written for it. A claim is saved as `started` before its CDI spec is written and as
`prepared` after; a driver killed in between finds it `started` and prepares it afresh when the
kubelet asks again (writing the same spec is harmless). A `prepared` claim is answered from the
file, without asking the API server, and its spec is written again if it went missing.

The file carries a checksum of its entries: a file that does not parse or does not match is
moved aside (`checkpoint.json.bad`) and the driver starts empty; the kubelet then asks again for
every claim it still needs, and each is prepared anew.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rdmaplane.adapters.documents import DocumentError, read_document
from rdmaplane.core import names
from rdmaplane.services.dra.files import write_json
from rdmaplane.services.dra.policy.claims import ClaimRef, PreparedClaim, PreparedDevice

log = logging.getLogger("rdmaplane.services.dra")
VERSION = names.DRA_CHECKPOINT_VERSION
STARTED, PREPARED = "started", "prepared"


@dataclass(frozen=True)
class PreparedEntry:
    state: str
    claim: PreparedClaim


class DraCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: dict[str, PreparedEntry] = {}

    def load(self) -> None:
        """Read the file (none: nothing prepared yet); a bad one is moved aside."""
        if not self.path.exists():
            return
        try:
            doc = read_document(self.path)
            self.entries = _entries(doc)
        except (DocumentError, ValueError, KeyError, TypeError) as e:
            bad = self.path.with_name(self.path.name + ".bad")
            os.replace(self.path, bad)
            log.error("%s unusable (%s); moved to %s, starting empty", self.path, e, bad.name)
            self.entries = {}

    def save(self) -> None:
        entries = {uid: _entry_object(e) for uid, e in sorted(self.entries.items())}
        write_json(
            self.path, {"version": VERSION, "checksum": _checksum(entries), "claims": entries}
        )


def _checksum(entries: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True).encode()).hexdigest()


def _entries(doc: object) -> dict[str, PreparedEntry]:
    if not isinstance(doc, dict) or doc.get("version") != VERSION:
        raise ValueError(f"not a {VERSION} document")
    claims = doc["claims"]
    if doc.get("checksum") != _checksum(claims):
        raise ValueError("checksum does not match")
    return {uid: _entry(uid, e) for uid, e in claims.items()}


def _entry_object(e: PreparedEntry) -> dict[str, Any]:
    c = e.claim
    return {
        "state": e.state,
        "namespace": c.ref.namespace,
        "name": c.ref.name,
        "specName": c.spec_name,
        "spec": c.spec,
        "devices": [
            {
                "requests": list(d.requests),
                "pool": d.pool,
                "device": d.device,
                "cdi": list(d.cdi_ids),
                **({"shareID": d.share_id} if d.share_id else {}),
            }
            for d in c.devices
        ],
    }


def _entry(uid: str, e: Mapping[str, Any]) -> PreparedEntry:
    if e["state"] not in (STARTED, PREPARED):
        raise ValueError(f"claim {uid}: state {e['state']!r}")
    devices = tuple(
        PreparedDevice(
            tuple(d["requests"]), d["pool"], d["device"], tuple(d["cdi"]), d.get("shareID")
        )
        for d in e["devices"]
    )
    ref = ClaimRef(str(e["namespace"]), str(e["name"]), uid)
    return PreparedEntry(e["state"], PreparedClaim(ref, devices, str(e["specName"]), e["spec"]))
