"""The fault actor: every poll it judges the watched ports and finds whom a fault hurts (pure
steps, `observe`); its own task (`run`) then asks `rdmaplane.core.faults.decide` what to do now,
asks the fleet's budget when an act is due, and carries each decision out through the pieces
beside it (notices, evictions, taints, Events), so a slow or unreachable API server never stalls
the poll loop."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from lightkube import ApiError, AsyncClient

from rdmaplane.adapters.kube.client import API_ERRORS
from rdmaplane.core import faults as policy  # what to do about faults, decided purely
from rdmaplane.core import repeat
from rdmaplane.core.allocation import Allocations
from rdmaplane.core.breaker import BudgetVerdict, Change
from rdmaplane.core.gid import plan_node
from rdmaplane.core.kernellog import KernelEvent
from rdmaplane.core.model import NodeTopology, PortObservation
from rdmaplane.core.names import FAULT_SINCE_LABEL
from rdmaplane.core.porthealth import FaultClass, PortKey, RuleTable, judge
from rdmaplane.core.selectors import compute_ports
from rdmaplane.core.settings.agent import FaultSettings
from rdmaplane.services.agent.breaker import FaultBudget
from rdmaplane.services.agent.faults.budget import BudgetTokens
from rdmaplane.services.agent.faults.events import FaultEvents, describe
from rdmaplane.services.agent.faults.evictions import Evictions
from rdmaplane.services.agent.faults.notices import Notices
from rdmaplane.services.agent.faults.pods import NotOurs
from rdmaplane.services.agent.faults.taints import Taints
from rdmaplane.services.agent.faults.view import Freshness, device_hcas, stale_view
from rdmaplane.services.agent.metrics import AgentMetrics, FaultMetrics
from rdmaplane.services.agent.policy.health import HealthState
from rdmaplane.services.agent.policy.inventory import Offered
from rdmaplane.services.agent.repeat import Offenders

log = logging.getLogger(__package__)


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
        self._watched: dict[str, tuple[int, ...]] = {}
        self._gid_index: int | None = None
        self._api_problem: str | None = None
        self._held: dict[str, str] = {}  # pod → why, to log a hold once, not every round
        self._pods: set[str] = set()
        self._watched_from: tuple[object, ...] | None = None
        self._wake = asyncio.Event()
        self.rounds = 0
        self.metrics = FaultMetrics(metrics.registry)
        self.budget = BudgetTokens(
            FaultBudget(kube, node_name, breaker) if kube and breaker.mode != "off" else None,
            breaker.mode,
            self.decision_rules.retry_s,
            self.metrics,
            self._breaker_changed,
            clock,
        )
        # What writes to the API server; None without one.
        self.events = FaultEvents(kube, node_name) if kube else None
        self.notices = (
            Notices(kube, node_name, self.events, self.decision_rules.action, config.grace_s, clock)
            if kube and self.events
            else None
        )
        self.evictions = Evictions(kube, node_name, self.events) if kube and self.events else None
        self.taints = Taints(kube, node_name, config.repeat.taint_effect, node_event, self.metrics)

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

    def wanted_taints(self) -> dict[str, policy.Taint]:
        """Our taints on the Node, by key (`Taints.wanted`)."""
        return self.taints.wanted(self.taint, self.quarantined)

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
        self.metrics.quarantined_ports.set(len(self.quarantined))
        for cls in FaultClass:
            self.metrics.active.labels(cls.value).set(
                sum(1 for f in faults.values() if f.cls == cls)
            )
        pods = {p.key: p.devices for p in allocations.pods}
        self._pods = set(pods)
        self.hurt = policy.pods_hurt(faults, device_hcas(offered, topo, resources), pods)
        self.taint = policy.node_taint(
            faults, self._watched, self.config.taint_effect, self.config.degraded_taint_effect
        )
        self.metrics.tainted.set(1 if self.taint is not None else 0)
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
        self.metrics.changes.labels(change.after.cls.value if change.after else "none").inc()

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
        new_noexecute = self.taints.new_noexecute(self.taint)
        answer = await self.budget.ask(wanted, new_noexecute) if stale is None else None
        decisions = policy.gate(wanted, self.hurt, self.ledger, answer)
        for decision in decisions:
            await self._carry_out(decision, now)
        api_up = self._api_problem is None and not self._view().api_failures
        if self.kube is not None and api_up and self.offenders is not None:
            await self._guarded(self.offenders.sync(self.state.fatal, self.state.pending))
        if self.kube is not None and self.decision_rules.action != policy.Action.OBSERVE and api_up:
            may_taint = not new_noexecute or (
                answer is not None and answer.verdict == BudgetVerdict.GRANTED
            )
            await self._guarded(self.taints.reconcile(self.wanted_taints(), may_taint))
        self.rounds += 1
        return decisions

    async def _carry_out(self, d: policy.Decision, now: float) -> None:
        if d.verb == policy.Verb.HOLD:
            if self._held.get(d.pod) != d.why:
                log.warning("fault: holding %s: %s", d.pod, d.why, extra={"pod": d.pod})
                self._held[d.pod] = d.why
            self.metrics.decisions.labels(d.verb.value, "held").inc()
            return
        if d.verb != policy.Verb.NOTIFY or not d.held:
            self._held.pop(d.pod, None)
        if d.verb == policy.Verb.OBSERVE:
            log.warning(
                "fault: %s holds %s (action observe: nothing done)",
                d.pod,
                describe(d.faults),
                extra={"pod": d.pod},
            )
            self.ledger = self.ledger.noticed(d.pod, d.faults, now)
            self.metrics.decisions.labels(d.verb.value, "done").inc()
            return
        if self.kube is None:
            return
        outcome = await self._guarded(self._do(d, now))
        self.metrics.decisions.labels(d.verb.value, outcome).inc()

    def _breaker_changed(self, change: Change) -> Awaitable[str]:
        """One Event when the breaker opens or closes (a budget is kept only with an API
        server)."""
        assert self.events is not None
        return self._guarded(self.events.breaker(change, self.config.breaker))

    async def _guarded(self, work: Awaitable[None]) -> str:
        """Run one API step: `done`, `skipped` (the pod is not ours any more) or `failed`."""
        try:
            await work
        except NotOurs as why:
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
        assert self.notices is not None and self.evictions is not None
        namespace, name = d.pod.split("/", 1)
        try:
            if d.verb == policy.Verb.NOTIFY:
                await self.notices.notify(namespace, name, d.faults, d.held)
                self.ledger = self.ledger.noticed(d.pod, d.faults, now, d.held)
            elif d.verb == policy.Verb.CLEAR:
                await self.notices.clear(namespace, name)
                self.ledger = self.ledger.cleared(d.pod)
            elif d.verb == policy.Verb.ACT:
                await self.evictions.act(namespace, name, d.faults, d.evict)
                self.ledger = self.ledger.acted(d.pod, now, d.evict)
        except NotOurs:
            self.ledger = self.ledger.cleared(d.pod)
            raise
        except API_ERRORS:
            self.ledger = self.ledger.failed(d.pod, now)
            raise


def _error(e: BaseException) -> str:
    if isinstance(e, ApiError):
        return f"HTTP {e.status.code}: {e.status.message}"
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
