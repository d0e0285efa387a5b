"""The fault budget in the API server: the blast-radius breaker's Lease (`rdmaplane.core.breaker`),
read and written with optimistic concurrency, and the census its storms are judged by.

The Lease (`fault.breaker.lease` in `fault.breaker.namespace`) carries the budget as JSON in
its annotation `rdmaplane.io/fault-budget`; a write names the version it read, so of two agents
racing for the last token one write wins, and the other reads again and finds it spent. A
budget that cannot be read (the API server away, a version this agent does not know) is an
`unknown` answer: nothing is done on it.

The census, per scope: the cluster's nodes are counted from the NodeResourceTopology objects
(one per agent; a one-item list gives the count), the domain's from the Nodes that carry the
agent's own tier label value; a node is faulty while it carries `rdmaplane.io/fault-since` (its
agent publishes it while a compute port has a fatal fault). Nodes are listed as metadata only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease
from lightkube.resources.core_v1 import Node

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.adapters.kube.client import API_ERRORS
from rdmaplane.core import breaker as fleet_breaker
from rdmaplane.core import fabric, names
from rdmaplane.core.names import FAULT_SINCE_LABEL
from rdmaplane.core.settings.agent import BreakerSettings

log = logging.getLogger("rdmaplane.services.agent.breaker")
BUDGET_ANNOTATION = names.FAULT_BUDGET_ANNOTATION
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1"
CONFLICT_RETRIES = 8  # writes that lost a race before the answer is `unknown`
LABELS_FOR_S = 600.0  # the node's own labels and the cluster's size change seldom
PEEK_FOR_S = 5.0  # a notice may say what the Lease said this long ago


def rules_of(config: BreakerSettings) -> fleet_breaker.BreakerRules:
    return fleet_breaker.BreakerRules(
        config.max_nodes_per_minute,
        config.max_faulty_share,
        config.min_faulty_nodes,
        config.window_s,
    )


def since_of(labels: Mapping[str, str]) -> float | None:
    """When a node's fault began, from its `rdmaplane.io/fault-since` label (None: not faulty,
    or a value that is no time)."""
    value = labels.get(FAULT_SINCE_LABEL, "")
    return float(value) if value.isdigit() else None


class FaultBudget:
    def __init__(
        self,
        kube: AsyncClient,
        node: str,
        config: BreakerSettings,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.kube = kube
        self.node = node
        self.config = config
        self.rules = rules_of(config)
        self._clock = clock
        self._labels: tuple[float, Mapping[str, str]] | None = None
        self._cluster_nodes: tuple[float, int] | None = None
        self._peeked: tuple[float, fleet_breaker.Budget] | None = None

    # ---------------------------------------------------------------- asking

    async def take(self) -> tuple[fleet_breaker.Answer, list[fleet_breaker.Change]]:
        """This node's token, or why not; the scopes this answer opened or closed."""
        try:
            census = await self.census()
            for _ in range(CONFLICT_RETRIES):
                lease, budget = await self._read()
                after, answer, changes = fleet_breaker.take(
                    budget, self.node, self._clock(), census, self.rules
                )
                if not (answer.fresh or changes) or await self._write(lease, after):
                    return answer, changes
            return fleet_breaker.Answer(
                fleet_breaker.BudgetVerdict.UNKNOWN, "the fault budget changed under every write"
            ), []
        except (*API_ERRORS, ValueError, KeyError, TypeError) as e:
            return fleet_breaker.Answer(
                fleet_breaker.BudgetVerdict.UNKNOWN,
                f"the fault budget could not be read: {_said(e)}",
            ), []

    async def peek(self) -> fleet_breaker.Answer | None:
        """The storm holding this node as the Lease says (None: none, or not readable): what a
        notice carries. Cached for a few seconds; takes nothing."""
        now = self._clock()
        try:
            if self._peeked is None or now - self._peeked[0] > PEEK_FOR_S:
                self._peeked = (now, (await self._read())[1])
            scopes = [
                fleet_breaker.CLUSTER,
                *([d] if (d := self._domain(await self._own_labels())) else []),
            ]
        except (*API_ERRORS, ValueError, KeyError, TypeError):
            return None
        opened = fleet_breaker.open_for(self._peeked[1], scopes)
        if opened is None:
            return None
        return fleet_breaker.Answer(
            fleet_breaker.BudgetVerdict.REFUSED, f"breaker open: {opened.reason}", storming=True
        )

    # ---------------------------------------------------------------- the census

    async def census(self) -> list[fleet_breaker.ScopeCount]:
        """The cluster, and this node's domain when its labels place it; counted as of the
        moment the first list was asked for (the lists are at least that new)."""
        at = self._clock()
        faulty = await self._metadata(Node, f"{FAULT_SINCE_LABEL}")
        size = await self._cluster_size()
        scopes = [fleet_breaker.ScopeCount(fleet_breaker.CLUSTER, size, _since(faulty), at)]
        domain = self._domain(await self._own_labels())
        if domain is not None:
            members = await self._metadata(Node, domain)
            scopes.append(fleet_breaker.ScopeCount(domain, len(members), _since(members), at))
        return scopes

    def _domain(self, labels: Mapping[str, str]) -> str | None:
        """`<tier label>=<switch>` of the node at `domainTier`, from its labels by the fabric
        model's schemes (topograph, GKE, EKS, OCI, ...); None when they do not say."""
        keys = fabric.scheme_of(labels)
        tier = self.config.domain_tier
        if keys is None or tier >= len(keys):
            return None
        return f"{keys[tier]}={labels[keys[tier]]}"

    async def _own_labels(self) -> Mapping[str, str]:
        now = self._clock()
        if self._labels is None or now - self._labels[0] > LABELS_FOR_S:
            node = await self.kube.get(Node, self.node)
            labels = (node.metadata.labels if node.metadata else None) or {}
            self._labels = (now, dict(labels))
        return self._labels[1]

    async def _cluster_size(self) -> int:
        """The NodeResourceTopology objects, one per agent (at least this node)."""
        now = self._clock()
        if self._cluster_nodes is None or now - self._cluster_nodes[0] > LABELS_FOR_S:
            doc = await _raw_list(self.kube, NodeResourceTopology, {"limit": "1"})
            count = len(doc.get("items") or ()) + int(
                (doc.get("metadata") or {}).get("remainingItemCount") or 0
            )
            self._cluster_nodes = (now, max(count, 1))
        return self._cluster_nodes[1]

    async def _metadata(self, res: type[Node], selector: str) -> list[dict[str, Any]]:
        """The metadata of the objects matching `selector`, every page."""
        out: list[dict[str, Any]] = []
        params = {"labelSelector": selector, "limit": "500"}
        while True:
            doc = await _raw_list(self.kube, res, params, METADATA_ONLY)
            out += [i.get("metadata") or {} for i in doc.get("items") or ()]
            token = (doc.get("metadata") or {}).get("continue")
            if not token:
                return out
            params = {**params, "continue": token}

    # ---------------------------------------------------------------- the Lease

    async def _read(self) -> tuple[Lease, fleet_breaker.Budget]:
        """The Lease and its budget, the Lease made when there is none yet."""
        name, namespace = self.config.lease, self.config.namespace
        try:
            lease = await self.kube.get(Lease, name, namespace=namespace)
        except ApiError as e:
            if e.status.code != 404:
                raise
            lease = Lease(metadata=ObjectMeta(name=name, namespace=namespace))
            try:
                lease = await self.kube.create(lease)
            except ApiError as again:
                if again.status.code != 409:  # another agent made it first
                    raise
                lease = await self.kube.get(Lease, name, namespace=namespace)
        text = ((lease.metadata.annotations if lease.metadata else None) or {}).get(
            BUDGET_ANNOTATION
        )
        return lease, fleet_breaker.from_document(
            json.loads(text)
        ) if text else fleet_breaker.Budget()

    async def _write(self, lease: Lease, budget: fleet_breaker.Budget) -> bool:
        """Replace the Lease as read (its resourceVersion: a concurrent write is a 409, False)."""
        assert lease.metadata is not None
        annotations = dict(lease.metadata.annotations or {})
        annotations[BUDGET_ANNOTATION] = json.dumps(
            fleet_breaker.to_document(budget), separators=(",", ":")
        )
        lease.metadata.annotations = annotations
        try:
            await self.kube.replace(lease)
        except ApiError as e:
            if e.status.code == 409:
                return False
            raise
        self._peeked = (self._clock(), budget)
        return True


def _since(metadata: Sequence[Mapping[str, Any]]) -> tuple[float, ...]:
    times = (since_of(m.get("labels") or {}) for m in metadata)
    return tuple(t for t in times if t is not None)


async def _raw_list(
    kube: AsyncClient, res: type[Any], params: Mapping[str, str], accept: str | None = None
) -> dict[str, Any]:
    """A list request's JSON as the server sent it. lightkube's `list` decodes the items
    only; the census needs the list's own metadata (`remainingItemCount`, `continue`) and
    metadata-only lists, so this builds the request with lightkube's own client (its URL
    rules, credentials and transport) and reads the body."""
    inner: Any = kube._client  # lightkube's generic client
    headers = {"Accept": accept} if accept else None
    request = inner.prepare_request("list", res=res, params=dict(params), headers=headers)
    response = await inner.send(inner.build_adapter_request(request))
    inner.raise_for_status(response)
    return cast(dict[str, Any], response.json())


def _said(e: BaseException) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status.code}: {e.status.message}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
