"""Repeat offenders on the Node (`rdmaplane.core.repeat`): the fault history kept in the Node's
annotation `rdmaplane.io/fault-history`, so it survives the agent, and the operator's
`rdmaplane.io/fault-clear` read and answered.

The history is read once before anything is recorded (a restarted agent goes on counting where
it was), then written whenever it changes. While a port is quarantined the Node is read again
every `recheck_s`, to see the operator's clear; the write that answers it removes the
annotation with the Node's resourceVersion as read, so a clear written meanwhile is not lost.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Collection
from typing import Any

from lightkube import AsyncClient
from lightkube.resources.core_v1 import Node
from lightkube.types import PatchType

from rdmaplane.core import repeat
from rdmaplane.core.porthealth import PortKey

log = logging.getLogger("rdmaplane.services.agent.faults")


class Offenders:
    def __init__(
        self,
        kube: AsyncClient,
        node: str,
        rules: repeat.RepeatRules,
        node_event: Callable[[str, str, str], None],
        *,
        clock: Callable[[], float] = time.time,
        recheck_s: float = 10.0,
    ) -> None:
        self.kube = kube
        self.node = node
        self.rules = rules
        self._node_event = node_event
        self._clock = clock
        self.recheck_s = recheck_s
        self.history: dict[PortKey, repeat.PortHistory] | None = None  # None: not read yet
        self._written: dict[str, Any] | None = None
        self._clear: tuple[str, str] | None = None  # (the operator's value, resourceVersion)
        self._read_at = -float("inf")

    @property
    def quarantined(self) -> dict[PortKey, str]:
        return repeat.quarantined(self.history or {}, self.rules)

    async def sync(self, fatal: Collection[PortKey], pending: Collection[PortKey]) -> None:
        """One round: read the Node when due, fold the fault state in, answer a clear, write
        what changed. Raises the API's errors (the caller counts them)."""
        now = self._clock()
        if self.history is None or (self.quarantined and now - self._read_at >= self.recheck_s):
            await self._read(now)
        assert self.history is not None
        before = self.quarantined
        history = repeat.reconcile(self.history, fatal, pending, now, self.rules)
        clear = self._clear
        if clear is not None:
            history = repeat.clear(history, clear[0])
        document = repeat.to_document(history)
        if document != self._written or clear is not None:
            await self._write(document, clear)
            self._written, self._clear = document, None
        self.history = history
        self._announce(before, self.quarantined, clear)

    async def _read(self, now: float) -> None:
        node = await self.kube.get(Node, self.node)
        meta = node.metadata
        annotations = (meta.annotations if meta else None) or {}
        text = annotations.get(repeat.HISTORY_ANNOTATION)
        history = {}
        if text:
            try:
                history = repeat.from_document(json.loads(text))
            except (ValueError, KeyError, TypeError) as e:
                log.warning(
                    "%s on %s unreadable (%s): counting afresh",
                    repeat.HISTORY_ANNOTATION,
                    self.node,
                    e,
                )
        if self.history is None:
            self.history = history
            self._written = repeat.to_document(history) if text else None
        value = annotations.get(repeat.CLEAR_ANNOTATION)
        self._clear = (value, meta.resourceVersion or "") if value is not None and meta else None
        self._read_at = now

    async def _write(self, document: dict[str, Any], clear: tuple[str, str] | None) -> None:
        annotations: dict[str, str | None] = {
            repeat.HISTORY_ANNOTATION: json.dumps(document, separators=(",", ":"), sort_keys=True)
        }
        metadata: dict[str, Any] = {"annotations": annotations}
        if clear is not None:
            annotations[repeat.CLEAR_ANNOTATION] = None
            metadata["resourceVersion"] = clear[1]  # a newer clear: 409, read again next round
        await self.kube.patch(Node, self.node, {"metadata": metadata}, patch_type=PatchType.MERGE)

    def _announce(
        self, before: dict[PortKey, str], after: dict[PortKey, str], clear: tuple[str, str] | None
    ) -> None:
        for key in sorted(after.keys() - before.keys()):
            message = f"{key[0]} {after[key]}"
            self._node_event("Warning", "RDMAPortQuarantined", message)
            log.warning(message, extra={"hca": key[0], "port": key[1]})
        for key in sorted(before.keys() - after.keys()):
            said = f" ({repeat.CLEAR_ANNOTATION}={clear[0]})" if clear else ""
            message = f"{key[0]} port {key[1]} back in service: its fault history cleared{said}"
            self._node_event("Normal", "RDMAPortReleased", message)
            log.info(message, extra={"hca": key[0], "port": key[1]})
