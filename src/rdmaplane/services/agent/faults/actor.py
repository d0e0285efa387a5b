"""The agent acting on RDMA faults: the fault notice, the RDMAFault condition, the eviction and
the node taints, decided by `rdmaplane.core.faults` and carried out against the API server.

`FaultActor.observe` runs on every poll (pure steps: symptoms, hysteresis, whom it hurts, the
taint wanted); its own task (`run`) then asks `faults.decide` what to do now and does it, so a
slow or unreachable API server never stalls the poll loop. Every decision is logged and
counted (`rdmaplane_agent_fault_decisions_total{verb,outcome}`); nothing is done while the view
is stale (the API server unreachable, PodResources older than two intervals): a pod is checked
to still be ours before anything is written to it, and the eviction goes through the Eviction
API (never a delete), so PodDisruptionBudgets and the job controllers' rules apply.

Before an eviction or a NoExecute taint the actor asks the fleet's budget for a token (the
blast-radius breaker, `rdmaplane.services.agent.breaker`): refused, the pods wait, their notices
say why,
and the breaker opening or closing is one Event for the cluster. The Node's fault history
(`rdmaplane.services.agent.repeat`) quarantines a port that keeps failing.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import cast

from lightkube import ApiError, AsyncClient
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import Event, Node, Pod
from lightkube.types import PatchType
from prometheus_client import Counter, Gauge

from rdmaplane.adapters.kube.client import API_ERRORS
from rdmaplane.core import breaker as fleet_breaker
from rdmaplane.core import faults as policy  # what to do about faults, decided purely
from rdmaplane.core import repeat
from rdmaplane.core.allocation import Allocations
from rdmaplane.core.apitime import api_time
from rdmaplane.core.gid import plan_node
from rdmaplane.core.kernellog import KernelEvent
from rdmaplane.core.model import NodeTopology, PortObservation
from rdmaplane.core.names import FAULT_SINCE_LABEL
from rdmaplane.core.notice import ANNOTATION, Notice, encode
from rdmaplane.core.porthealth import FaultClass, PortKey, RuleTable, judge
from rdmaplane.core.selectors import compute_ports
from rdmaplane.core.settings.agent import FaultSettings
from rdmaplane.services.agent.breaker import FaultBudget
from rdmaplane.services.agent.metrics import AgentMetrics
from rdmaplane.services.agent.policy.health import HealthState
from rdmaplane.services.agent.policy.inventory import Offered
from rdmaplane.services.agent.repeat import Offenders

log = logging.getLogger(__package__)
COMPONENT = "rdmaplane-agent"


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


def notice(fault: policy.Fault, wall_since: float, held: str = "") -> str:
    """The `rdmaplane.io/fault` annotation (`rdmaplane.core.notice`): what broke, how badly,
    why, since when, and why the breaker holds the action back (`held`), when it does."""
    since = api_time(wall_since)
    return encode(Notice(fault.hca, fault.port, fault.cls.value, fault.reason, since, held))


@dataclass(frozen=True, slots=True)
class Freshness:
    """How fresh the agent's knowledge is: consecutive failed publish cycles, and when
    PodResources last answered (monotonic; None: never)."""

    api_failures: int
    podresources_at: float | None
    podresources_interval_s: float


def stale_view(view: Freshness, now: float) -> str | None:
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
        view: Callable[[], Freshness],
        node_event: Callable[[str, str, str], None] = lambda *_: None,
        clock: Callable[[], float] = time.monotonic,
        event_namespace: str = "default",
    ) -> None:
        self.config = config
        self.node_name = node_name
        self.kube = kube
        self._view = view
        self._node_event = node_event
        self._clock = clock
        self.event_namespace = event_namespace
        breaker = config.breaker
        self.budget = (
            FaultBudget(kube, node_name, breaker) if kube and breaker.mode != "off" else None
        )
        self._answer: tuple[float, fleet_breaker.Answer] | None = (
            None  # the last, and when (monotonic)
        )
        self._token_until = -float("inf")  # wall clock
        self.offenders = (
            Offenders(
                kube,
                node_name,
                repeat.RepeatRules(config.repeat.count, config.repeat.window_s),
                node_event,
            )
            if kube
            else None
        )
        self.faulty_since: float | None = None  # wall clock: the fault-since label's value
        self.rules = rules  # the health monitor's: one rule table for both
        self.fault_rules = policy.FaultRules(config.fatal_after_s, config.clear_after_s)
        self.decision_rules = policy.DecisionRules(
            policy.Action(config.action), config.grace_s, config.max_evictions_per_minute
        )
        self.state = policy.FaultState()
        self.ledger = policy.Ledger()
        self.hurt: dict[str, tuple[policy.Fault, ...]] = {}
        self.taint: policy.Taint | None = None
        self._taints_written: dict[str, policy.Taint] | None = (
            None  # ours on the Node; None: not known
        )
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
        self.breaker_answers = Counter(
            "rdmaplane_agent_fault_breaker_answers",
            "The fault budget's answers to this agent (granted, refused, unknown)",
            ["verdict"],
            registry=r,
        )
        self.breaker_open = Gauge(
            "rdmaplane_agent_fault_breaker_open",
            "1 while the blast-radius breaker holds this node's fault actions (a storm)",
            registry=r,
        )
        self.quarantined_ports = Gauge(
            "rdmaplane_agent_quarantined_ports",
            "Ports out of service for failing again and again, until an operator clears them",
            registry=r,
        )

    @property
    def quarantined(self) -> dict[PortKey, str]:
        """Ports that keep failing, out of service until cleared (the health rules read it)."""
        return self.offenders.quarantined if self.offenders is not None else {}

    def node_labels(self) -> dict[str, str]:
        """`rdmaplane.io/fault-since` while a compute port has a fatal fault (the breaker's
        census reads it)."""
        if self.faulty_since is None:
            return {}
        return {FAULT_SINCE_LABEL: str(int(self.faulty_since))}

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
        kernel: Sequence[KernelEvent] = (),
    ) -> None:
        now = self._clock()
        found = judge(
            [(hca, n) for hca, numbers in self._watched.items() for n in numbers],
            self.rules,
            observations={(o.hca, o.port): o for o in observations},
            memory=health.ports,
            topology=topo,
            gid_index=self._gid_index,
            now=now,
            in_service=health.in_service,
            kernel=kernel,
            quarantined=self.quarantined,
        )
        self.state, changes = policy.step(self.state, now, policy.classify(found), self.fault_rules)
        for change in changes:
            self._report(change)
        faults = self.state.faults
        fatal = [f.since for f in faults.values() if f.cls == FaultClass.FATAL]
        if not fatal:
            self.faulty_since = None
        elif self.faulty_since is None:
            self.faulty_since = time.time() - (now - min(fatal))
        self.quarantined_ports.set(len(self.quarantined))
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
        """One round: decide on the current view, ask the budget when an act (or a NoExecute
        taint) is due, carry out each decision, keep the Node's fault history and reconcile the
        taints (which need no PodResources, only a reachable API server)."""
        now = self._clock()
        self.ledger = self.ledger.forget_gone(self._pods, now)
        stale = self.stale()
        wanted = policy.decide(now, self.hurt, self.ledger, self.decision_rules, stale)
        new_noexecute = self._new_noexecute()
        answer = await self._ask(wanted, new_noexecute) if stale is None else None
        decisions = policy.gate(wanted, self.hurt, self.ledger, answer)
        for decision in decisions:
            await self._carry_out(decision, now)
        api_up = self._api_problem is None and not self._view().api_failures
        if self.kube is not None and api_up and self.offenders is not None:
            await self._guarded(self.offenders.sync(self.state.fatal, self.state.pending))
        if self.kube is not None and self.decision_rules.action != policy.Action.OBSERVE and api_up:
            may_taint = not new_noexecute or (
                answer is not None and answer.verdict == fleet_breaker.BudgetVerdict.GRANTED
            )
            await self._guarded(self._reconcile_taints(may_taint))
        self.rounds += 1
        return decisions

    def _new_noexecute(self) -> bool:
        """The rdma-unhealthy taint wanted evicts (NoExecute) and is not on the Node yet."""
        taint = self.taint
        written = (self._taints_written or {}).get(policy.TAINT_KEY)
        return taint is not None and taint.effect == "NoExecute" and written != taint

    async def _ask(
        self, wanted: Sequence[policy.Decision], new_noexecute: bool
    ) -> fleet_breaker.Answer | None:
        """The budget's word for this round: a token when an act or a NoExecute taint is due
        (a token held is used for a taint until it ends; an eviction asks again, so a token
        taken just before a storm was seen does not outlive the storm; a refusal is asked again
        after `retry_s`), else, when a notice goes out, whether a storm holds the node."""
        evicting = any(d.verb == policy.Verb.ACT for d in wanted)
        acting = new_noexecute or evicting
        if self.budget is None:
            return (
                fleet_breaker.Answer(fleet_breaker.BudgetVerdict.GRANTED, "no fault budget")
                if acting
                else None
            )
        if not acting:
            if any(d.verb == policy.Verb.NOTIFY for d in wanted):
                peeked = await self.budget.peek()
                return self._said(peeked) if peeked is not None else None
            return None
        if time.time() < self._token_until and not evicting:
            return fleet_breaker.Answer(
                fleet_breaker.BudgetVerdict.GRANTED, "token held", self._token_until
            )
        now = self._clock()
        if self._answer is not None and now - self._answer[0] < self.decision_rules.retry_s:
            return self._said(self._answer[1])
        answer, changes = await self.budget.take()
        self._answer = (now, answer)
        self.breaker_answers.labels(answer.verdict.value).inc()
        self.breaker_open.set(1 if answer.storming else 0)
        if answer.verdict == fleet_breaker.BudgetVerdict.GRANTED and answer.until is not None:
            self._token_until = answer.until
            self._answer = None
        for change in changes:
            await self._guarded(self._breaker_event(change))
        if answer.verdict != fleet_breaker.BudgetVerdict.GRANTED:
            log.warning("fault budget: %s: %s", answer.verdict.value, answer.why)
        return self._said(answer)

    def _said(self, answer: fleet_breaker.Answer) -> fleet_breaker.Answer:
        """In `observe` mode a refusal is only said: the act goes ahead, the notice holds
        nothing."""
        if (
            self.config.breaker.mode == "observe"
            and answer.verdict != fleet_breaker.BudgetVerdict.GRANTED
        ):
            return fleet_breaker.Answer(
                fleet_breaker.BudgetVerdict.GRANTED, f"observe mode, would hold: {answer.why}"
            )
        return answer

    async def _breaker_event(self, change: fleet_breaker.Change) -> None:
        """One Event for the cluster when the breaker opens or closes: on the budget's Lease,
        posted by the agent whose write changed it."""
        assert self.kube is not None
        reason = "RDMAFaultBreakerOpen" if change.opened else "RDMAFaultBreakerClosed"
        said = f"breaker open: {change.reason}" if change.opened else change.reason
        if change.opened:
            said += "; fault actions held (notices only) until the storm is over"
        else:
            said += "; held fault actions go ahead within the budget"
        lease = {"name": self.config.breaker.lease, "namespace": self.config.breaker.namespace}
        await self._event(
            {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", **lease},
            lease["namespace"],
            "Warning" if change.opened else "Normal",
            reason,
            said,
        )
        log.warning("%s (%s)", said, reason)

    async def _carry_out(self, d: policy.Decision, now: float) -> None:
        if d.verb == policy.Verb.HOLD:
            if self._held.get(d.pod) != d.why:
                log.warning("fault: holding %s: %s", d.pod, d.why, extra={"pod": d.pod})
                self._held[d.pod] = d.why
            self.decisions.labels(d.verb.value, "held").inc()
            return
        if d.verb != policy.Verb.NOTIFY or not d.held:
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
                await self._notify(namespace, name, d.faults, d.held)
                self.ledger = self.ledger.noticed(d.pod, d.faults, now, d.held)
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

    async def _notify(
        self, namespace: str, name: str, faults: Sequence[policy.Fault], held: str = ""
    ) -> None:
        assert self.kube is not None
        pod = await self._ours(namespace, name)
        worst = faults[0]
        wall = time.time() - (self._clock() - worst.since)
        patch = {"metadata": {"annotations": {ANNOTATION: notice(worst, wall, held)}}}
        await self.kube.patch(Pod, name, patch, namespace=namespace, patch_type=PatchType.MERGE)
        then = {
            policy.Action.EVICT: f"; evicting in {self.config.grace_s:g} s",
            policy.Action.NOTIFY: f"; condition {policy.CONDITION} in {self.config.grace_s:g} s",
        }.get(self.decision_rules.action, "")
        if held:
            then = f"; held: {held}"
        fatal = worst.cls == FaultClass.FATAL
        message = _describe(faults) + (then if fatal else "")
        await self._pod_event(pod, "Warning", "RDMAFault", message)
        log.warning("fault notice to %s/%s: %s", namespace, name, message, extra={"pod": name})

    async def _clear(self, namespace: str, name: str) -> None:
        assert self.kube is not None
        pod = await self._ours(namespace, name)
        patch = {"metadata": {"annotations": {ANNOTATION: None}}}
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
            "lastTransitionTime": api_time(time.time()),
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
        assert pod.metadata is not None and pod.metadata.namespace is not None
        involved = {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": pod.metadata.name,
            "namespace": pod.metadata.namespace,
            "uid": pod.metadata.uid,
        }
        await self._event(involved, pod.metadata.namespace, type_, reason, message)

    async def _event(
        self, involved: Mapping[str, object], namespace: str, type_: str, reason: str, message: str
    ) -> None:
        assert self.kube is not None
        now = api_time(time.time())
        event = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{involved['name']}.", "namespace": namespace},
            "involvedObject": involved,
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

    def wanted_taints(self) -> dict[str, policy.Taint]:
        """Our taints on the Node, by key: rdma-unhealthy (every compute HCA fatal) and
        rdma-quarantine (a port out of service for failing again and again)."""
        out = {policy.TAINT_KEY: self.taint} if self.taint is not None else {}
        effect, quarantined = self.config.repeat.taint_effect, self.quarantined
        if effect is not None and quarantined:
            value = f"{len(quarantined)}-ports"
            out[repeat.QUARANTINE_TAINT_KEY] = policy.Taint(
                repeat.QUARANTINE_TAINT_KEY, value, effect
            )
        return out

    async def _reconcile_taints(self, may_taint: bool) -> None:
        """Make the node carry exactly the taints wanted under our keys, by an optimistic
        update: a concurrent change of the taints (409) is retried on the next round. A new
        NoExecute taint waits for the budget's token (`may_taint`)."""
        assert self.kube is not None
        wanted = self.wanted_taints()
        if not may_taint and policy.TAINT_KEY in wanted:
            wanted = {k: t for k, t in wanted.items() if k != policy.TAINT_KEY}
            if self._taints_written is not None and policy.TAINT_KEY in self._taints_written:
                wanted[policy.TAINT_KEY] = self._taints_written[policy.TAINT_KEY]
        if wanted == self._taints_written:
            return
        node = await self.kube.get(Node, self.node_name)
        current = list((node.spec.taints if node.spec else None) or [])
        ours = {
            t.key: policy.Taint(t.key, t.value or "", t.effect) for t in current if t.key in OURS
        }
        if ours == wanted:
            self._taints_written = wanted
            return
        kept = [t.to_dict() for t in current if t.key not in OURS]
        taints = kept + [
            {"key": t.key, "value": t.value, "effect": t.effect} for t in wanted.values()
        ]
        assert node.metadata is not None
        patch = {
            "metadata": {"resourceVersion": node.metadata.resourceVersion},
            "spec": {"taints": taints},
        }
        await self.kube.patch(Node, self.node_name, patch, patch_type=PatchType.MERGE)
        self._taints_written = wanted
        for key in sorted(wanted.keys() | ours.keys()):
            self._said_taint(key, ours.get(key), wanted.get(key))

    def _said_taint(
        self, key: str, before: policy.Taint | None, after: policy.Taint | None
    ) -> None:
        if before == after:
            return
        if after is not None:
            why = {policy.TAINT_KEY: "every compute HCA fatal"}.get(key, "ports quarantined")
            message = f"taint {after.key}={after.value}:{after.effect}: {why}"
            self._node_event("Warning", "RDMANodeTainted", message)
            log.warning(message)
        else:
            self._node_event("Normal", "RDMANodeUntainted", f"taint {key} removed")
            log.info("taint %s removed", key)
        self.decisions.labels("taint" if after else "untaint", "done").inc()


OURS = (policy.TAINT_KEY, repeat.QUARANTINE_TAINT_KEY)


def _describe(faults: Iterable[policy.Fault]) -> str:
    return "; ".join(f"{f.hca} port {f.port} {f.cls.value}: {f.reason}" for f in faults)


def _error(e: BaseException) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status.code}: {e.status.message}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
