"""The agent acting on RDMA faults: the fault notice, the RDMAFault condition, the eviction and
the node taint, decided by `rdmaplane.faults` and carried out against the API server.

`FaultActor.observe` runs on every poll (pure steps: symptoms, hysteresis, whom it hurts, the
taint wanted); its own task (`run`) then asks `faults.decide` what to do now and does it, so a
slow or unreachable API server never stalls the poll loop. Every decision is logged and
counted (`rdmaplane_agent_fault_decisions_total{verb,outcome}`); nothing is done while the view
is stale (the API server unreachable, PodResources older than two intervals): a pod is checked
to still be ours before anything is written to it, and the eviction goes through the Eviction
API (never a delete), so PodDisruptionBudgets and the job controllers' rules apply.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import cast

import httpx2
from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType
from prometheus_client import Counter, Gauge

from rdmaplane import faults as policy  # what to do about faults, decided purely
from rdmaplane.agent.allocation import Allocations
from rdmaplane.agent.health import HealthState
from rdmaplane.agent.inventory import Offered
from rdmaplane.agent.metrics import AgentMetrics
from rdmaplane.agent.settings import FaultSettings
from rdmaplane.gid import plan_node
from rdmaplane.model import NodeTopology, PortObservation
from rdmaplane.porthealth import FaultClass, RuleTable, judge
from rdmaplane.selectors import compute_ports

log = logging.getLogger("rdmaplane.agent.faults")
COMPONENT = "rdmaplane-agent"
API_ERRORS = (ApiError, httpx2.HTTPError, OSError, TimeoutError)


def device_hcas(
    offered: Sequence[Offered], topo: NodeTopology, resources: Iterable[str]
) -> dict[tuple[str, str], tuple[str, ...]]:
    """The HCAs each device grants: the embedded plugin's devices (a shared slot grants its
    pool); without it (a standalone plugin), exclusive devices by PCI address in `resources`."""
    if offered:
        return {(o.resource, o.device_id): o.hcas for o in offered}
    return {
        (r, h.pci.address): (h.name,) for r in resources for h in topo.hcas if h.pci is not None
    }


def notice(fault: policy.Fault, wall_since: float) -> str:
    """The `rdmaplane.io/fault` annotation: what broke, how badly, why, since when."""
    since = dt.datetime.fromtimestamp(wall_since, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    doc = {
        "hca": fault.hca,
        "port": fault.port,
        "class": fault.cls.value,
        "reason": fault.reason,
        "since": since,
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _timestamp(at: dt.datetime | None = None) -> str:
    return (at or dt.datetime.now(dt.UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True, slots=True)
class View:
    """How fresh the agent's knowledge is: consecutive failed publish cycles, and when
    PodResources last answered (monotonic; None: never)."""

    api_failures: int
    podresources_at: float | None
    podresources_interval_s: float


def stale_view(view: View, now: float) -> str | None:
    """Why the view cannot be trusted for acting on pods, or None when it can. The texts stay
    the same while the cause does, so a hold is logged once."""
    if view.api_failures:
        return "API server unreachable"
    if view.podresources_at is None:
        return "PodResources never answered"
    limit = 2 * view.podresources_interval_s
    if now - view.podresources_at > limit:
        return f"PodResources older than two intervals ({limit:g} s)"
    return None


class _Skip(Exception):
    """The pod is not ours to act on any more (gone, elsewhere, already going)."""


class FaultActor:
    def __init__(
        self,
        config: FaultSettings,
        rules: RuleTable,
        node_name: str,
        kube: AsyncClient | None,
        metrics: AgentMetrics,
        *,
        view: Callable[[], View],
        node_event: Callable[[str, str, str], None] = lambda *_: None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self.node_name = node_name
        self.kube = kube
        self._view = view
        self._node_event = node_event
        self._clock = clock
        self.rules = rules  # the health monitor's: one rule table for both
        self.fault_rules = policy.FaultRules(config.fatal_after_s, config.clear_after_s)
        self.decision_rules = policy.DecisionRules(
            policy.Action(config.action), config.grace_s, config.max_evictions_per_minute
        )
        self.state = policy.FaultState()
        self.ledger = policy.Ledger()
        self.hurt: dict[str, tuple[policy.Fault, ...]] = {}
        self.taint: policy.Taint | None = None
        self._taint_written: tuple[policy.Taint | None] | None = None  # None: not known
        self._watched: dict[str, tuple[int, ...]] = {}
        self._gid_index: int | None = None
        self._api_problem: str | None = None
        self._held: dict[str, str] = {}  # pod → why, to log a hold once, not every round
        self._pods: set[str] = set()
        self._watched_from: tuple[object, ...] | None = None
        self._wake = asyncio.Event()
        self.rounds = 0
        r = metrics.registry
        self.decisions = Counter(
            "rdmaplane_agent_fault_decisions",
            "Fault decisions per verb (notify, act, clear, observe, hold) and outcome",
            ["verb", "outcome"],
            registry=r,
        )
        self.changes = Counter(
            "rdmaplane_agent_fault_changes",
            "Faults raised, changed or cleared, by the class they changed to (none = cleared)",
            ["to"],
            registry=r,
        )
        self.active = Gauge(
            "rdmaplane_agent_faults", "Ports with an active fault, per class", ["class"], registry=r
        )
        self.tainted = Gauge(
            "rdmaplane_agent_node_tainted", "1 while the rdma-unhealthy taint is wanted", registry=r
        )

    # ---------------------------------------------------------------- pure steps, every poll

    def watch(self, topo: NodeTopology, managed: Sequence[str]) -> None:
        """The ports to judge and the GID index pods were given, after a (re)discovery or a
        change of what the plugin offers (cheap when neither changed)."""
        if (topo, managed) == self._watched_from:  # the same topology compares by identity
            return
        self._watched_from = (topo, managed)
        ports = compute_ports(topo)
        self._watched = policy.watched_ports(
            topo, managed, [(h.name, p.number) for h, p in ports], self._watched
        )
        gid_index = plan_node(topo, ports).uniform_index if ports else None
        if gid_index is not None:  # the last one pods were started with
            self._gid_index = gid_index

    def observe(
        self,
        topo: NodeTopology,
        observations: Iterable[PortObservation],
        health: HealthState,
        offered: Sequence[Offered],
        allocations: Allocations,
        resources: Iterable[str],
    ) -> None:
        now = self._clock()
        found = judge(
            [(hca, n) for hca, numbers in self._watched.items() for n in numbers],
            self.rules,
            observations={(o.hca, o.port): o for o in observations},
            memory=health.ports,
            topology=topo,
            gid_index=self._gid_index,
        )
        self.state, changes = policy.step(self.state, now, policy.classify(found), self.fault_rules)
        for change in changes:
            self._report(change)
        faults = self.state.faults
        for cls in FaultClass:
            self.active.labels(cls.value).set(sum(1 for f in faults.values() if f.cls == cls))
        pods = {p.key: p.devices for p in allocations.pods}
        self._pods = set(pods)
        self.hurt = policy.pods_hurt(faults, device_hcas(offered, topo, resources), pods)
        self.taint = policy.node_taint(
            faults, self._watched, self.config.taint_effect, self.config.degraded_taint_effect
        )
        self.tainted.set(1 if self.taint is not None else 0)
        self._wake.set()

    def _report(self, change: policy.FaultChange) -> None:
        hca, port = change.key
        if change.after is None:
            message = f"{hca} port {port}: fault cleared"
            self._node_event("Normal", "RDMAFaultCleared", message)
            log.info(message, extra={"hca": hca, "port": port})
        else:
            f = change.after
            message = f"{hca} port {port}: {f.cls.value} fault: {f.reason}"
            self._node_event("Warning", "RDMAFault", message)
            log.warning(message, extra={"hca": hca, "port": port, "class": f.cls.value})
        self.changes.labels(change.after.cls.value if change.after else "none").inc()

    # ---------------------------------------------------------------- acting, its own task

    async def run(self) -> None:
        """Act whenever a poll woke us; returns only when cancelled."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            await self.act_once()

    def stale(self) -> str | None:
        return self._api_problem or stale_view(self._view(), self._clock())

    async def act_once(self) -> list[policy.Decision]:
        """One round: decide on the current view, carry out each decision, reconcile the taint
        (which needs no PodResources, only a reachable API server)."""
        now = self._clock()
        self.ledger = self.ledger.forget_gone(self._pods, now)
        decisions = policy.decide(now, self.hurt, self.ledger, self.decision_rules, self.stale())
        for decision in decisions:
            await self._carry_out(decision, now)
        api_up = self._api_problem is None and not self._view().api_failures
        if self.kube is not None and self.decision_rules.action != policy.Action.OBSERVE and api_up:
            await self._guarded(self._reconcile_taint())
        self.rounds += 1
        return decisions

    async def _carry_out(self, d: policy.Decision, now: float) -> None:
        if d.verb == policy.Verb.HOLD:
            if self._held.get(d.pod) != d.why:
                log.warning("fault: holding %s: %s", d.pod, d.why, extra={"pod": d.pod})
                self._held[d.pod] = d.why
            self.decisions.labels(d.verb.value, "held").inc()
            return
        self._held.pop(d.pod, None)
        if d.verb == policy.Verb.OBSERVE:
            log.warning(
                "fault: %s holds %s (action observe: nothing done)",
                d.pod,
                _describe(d.faults),
                extra={"pod": d.pod},
            )
            self.ledger = self.ledger.noticed(d.pod, d.faults, now)
            self.decisions.labels(d.verb.value, "done").inc()
            return
        if self.kube is None:
            return
        outcome = await self._guarded(self._do(d, now))
        self.decisions.labels(d.verb.value, outcome).inc()

    async def _guarded(self, work: Awaitable[None]) -> str:
        """Run one API step: `done`, `skipped` (the pod is not ours any more) or `failed`."""
        try:
            await work
        except _Skip as why:
            log.info("fault: %s", why)
            return "skipped"
        except API_ERRORS as e:
            if not isinstance(e, ApiError):
                self._api_problem = f"API server unreachable ({type(e).__name__})"
            log.warning("fault: API request failed: %s", _error(e))
            return "failed"
        self._api_problem = None
        return "done"

    async def _do(self, d: policy.Decision, now: float) -> None:
        assert self.kube is not None
        namespace, name = d.pod.split("/", 1)
        try:
            if d.verb == policy.Verb.NOTIFY:
                await self._notify(namespace, name, d.faults)
                self.ledger = self.ledger.noticed(d.pod, d.faults, now)
            elif d.verb == policy.Verb.CLEAR:
                await self._clear(namespace, name)
                self.ledger = self.ledger.cleared(d.pod)
            elif d.verb == policy.Verb.ACT:
                await self._act(namespace, name, d.faults, d.evict)
                self.ledger = self.ledger.acted(d.pod, now, d.evict)
        except _Skip:
            self.ledger = self.ledger.cleared(d.pod)
            raise
        except API_ERRORS:
            self.ledger = self.ledger.failed(d.pod, now)
            raise

    async def _ours(self, namespace: str, name: str) -> Pod:
        """The pod, if it is still on this node and not already going away."""
        assert self.kube is not None
        try:
            pod = await self.kube.get(Pod, name, namespace=namespace)
        except ApiError as e:
            if e.status.code == 404:
                raise _Skip(f"{namespace}/{name} is gone") from None
            raise
        node = pod.spec.nodeName if pod.spec else None
        if node != self.node_name:
            raise _Skip(f"{namespace}/{name} runs on {node}, not {self.node_name}: stale view")
        if pod.metadata is not None and pod.metadata.deletionTimestamp is not None:
            raise _Skip(f"{namespace}/{name} is already terminating")
        return pod

    async def _notify(self, namespace: str, name: str, faults: Sequence[policy.Fault]) -> None:
        assert self.kube is not None
        pod = await self._ours(namespace, name)
        worst = faults[0]
        wall = time.time() - (self._clock() - worst.since)
        patch = {"metadata": {"annotations": {policy.ANNOTATION: notice(worst, wall)}}}
        await self.kube.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        then = {
            policy.Action.EVICT: f"; evicting in {self.config.grace_s:g} s",
            policy.Action.NOTIFY: f"; condition {policy.CONDITION} in {self.config.grace_s:g} s",
        }.get(self.decision_rules.action, "")
        fatal = worst.cls == FaultClass.FATAL
        message = _describe(faults) + (then if fatal else "")
        await self._pod_event(pod, "Warning", "RDMAFault", message)
        log.warning("fault notice to %s/%s: %s", namespace, name, message, extra={"pod": name})

    async def _clear(self, namespace: str, name: str) -> None:
        assert self.kube is not None
        pod = await self._ours(namespace, name)
        patch = {"metadata": {"annotations": {policy.ANNOTATION: None}}}
        await self.kube.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        await self._pod_event(pod, "Normal", "RDMAFaultCleared", "the RDMA devices recovered")
        log.info("fault notice cleared on %s/%s", namespace, name)

    async def _act(
        self, namespace: str, name: str, faults: Sequence[policy.Fault], evict: bool
    ) -> None:
        """The RDMAFault condition first (so the job controller sees why when the pod fails),
        then the eviction."""
        assert self.kube is not None
        pod = await self._ours(namespace, name)
        condition = {
            "type": policy.CONDITION,
            "status": "True",
            "reason": "FatalPortFault",
            "message": _describe(faults)[:1024],
            "lastTransitionTime": _timestamp(),
        }
        patch = {"status": {"conditions": [condition]}}
        await self.kube.patch(
            Pod.Status, name, patch, namespace=namespace, patch_type=PatchType.STRATEGIC
        )
        if not evict:
            log.warning("fault: %s/%s marked %s", namespace, name, policy.CONDITION)
            return
        eviction = Pod.Eviction(metadata=ObjectMeta(name=name, namespace=namespace))
        await self.kube.create(eviction, name, namespace=namespace)
        await self._pod_event(pod, "Warning", "RDMAFaultEviction", f"evicted: {_describe(faults)}")
        log.warning("fault: evicted %s/%s: %s", namespace, name, _describe(faults))

    async def _pod_event(self, pod: Pod, type_: str, reason: str, message: str) -> None:
        assert self.kube is not None and pod.metadata is not None
        now = _timestamp()
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {
                "generateName": f"{pod.metadata.name}.",
                "namespace": pod.metadata.namespace,
            },
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "namespace": pod.metadata.namespace,
                "uid": pod.metadata.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT, "host": self.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        await self.kube.create(cast(Event, Event.from_dict(event)))

    async def _reconcile_taint(self) -> None:
        """Make the node carry exactly the taint wanted (under our key), by an optimistic
        update: a concurrent change of the taints (409) is retried on the next round."""
        assert self.kube is not None
        if self._taint_written == (self.taint,):
            return
        node = await self.kube.get(Node, self.node_name)
        current = list((node.spec.taints if node.spec else None) or [])
        kept = [t.to_dict() for t in current if t.key != policy.TAINT_KEY]
        ours = [t for t in current if t.key == policy.TAINT_KEY]
        wanted = self.taint
        same = (
            len(ours) == 1
            and wanted is not None
            and (ours[0].value, ours[0].effect) == (wanted.value, wanted.effect)
        )
        if same or (not ours and wanted is None):
            self._taint_written = (wanted,)
            return
        taints = kept + (
            [{"key": wanted.key, "value": wanted.value, "effect": wanted.effect}] if wanted else []
        )
        assert node.metadata is not None
        patch = {
            "metadata": {"resourceVersion": node.metadata.resourceVersion},
            "spec": {"taints": taints},
        }
        await self.kube.patch(Node, self.node_name, patch, patch_type=PatchType.MERGE)
        self._taint_written = (wanted,)
        if wanted is not None:
            message = f"taint {wanted.key}={wanted.value}:{wanted.effect}: every compute HCA fatal"
            self._node_event("Warning", "RDMANodeTainted", message)
            log.warning(message)
        else:
            self._node_event("Normal", "RDMANodeUntainted", f"taint {policy.TAINT_KEY} removed")
            log.info("taint %s removed", policy.TAINT_KEY)
        self.decisions.labels("taint" if wanted else "untaint", "done").inc()


def _describe(faults: Iterable[policy.Fault]) -> str:
    return "; ".join(f"{f.hca} port {f.port} {f.cls.value}: {f.reason}" for f in faults)


def _error(e: BaseException) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status.code}: {e.status.message}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
