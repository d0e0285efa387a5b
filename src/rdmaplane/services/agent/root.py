"""The node agent: one asyncio process wiring discovery, the device plugin, allocation state,
the publisher, the health monitor and the metrics endpoint.

At start, with `fixNetnsMode`, an exclusive RDMA netns mode is switched to shared (RDMA netlink)
when no HCA is in another network namespace.

Loops, each its own task so none can stall another, each under one `Supervisor` (a task that
fails is logged, restarted with backoff, and `/healthz` fails until it runs again):
- poll (every `poll_interval_s`, and at once when called): cheap probe; full rediscovery (in a
  thread) only when the fingerprint changed or `rediscover_interval_s` passed; health step;
  feed the device plugin; also when pending fatal symptoms reach `fault.fatalAfter`;
- states (every `state_poll_interval_s`): the ports' states alone; a change calls the poll;
- allocations (every `allocation_interval_s`): the kubelet's PodResources;
- publish: the `Publisher`, woken whenever the desired state changed;
- the device plugin's, one per pool: staying registered with the kubelet.
The HTTP server answers `/metrics`, `/healthz` and `/readyz` throughout; an unreachable API
server or kubelet only ever affects the publisher and the allocation figures.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Protocol

from lightkube import AsyncClient
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

from rdmaplane.adapters.discovery import read_node
from rdmaplane.adapters.discovery.kernellog import KernelLog
from rdmaplane.adapters.discovery.probe import Probe, Reading, settle
from rdmaplane.adapters.discovery.rdma_netlink import NetlinkError, RdmaNetlink
from rdmaplane.adapters.discovery.sysfs import hcas_in_other_namespaces
from rdmaplane.adapters.kube import async_client
from rdmaplane.adapters.kubelet.kubeletconfig import read_kubelet_topology_manager
from rdmaplane.adapters.kubelet.podresources import PodResourcesClient, PodResourcesError
from rdmaplane.adapters.supervisor import Supervisor
from rdmaplane.core import nrt
from rdmaplane.core.allocation import Allocations
from rdmaplane.core.kernellog import KernelEvent
from rdmaplane.core.model import NetnsMode, NodeTopology
from rdmaplane.core.names import FAULT_SINCE_LABEL
from rdmaplane.core.porthealth import rule_table
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings, Pool
from rdmaplane.services.agent.deviceplugin import EmbeddedPlugin
from rdmaplane.services.agent.fabric import FabricSource
from rdmaplane.services.agent.faults import FaultActor, Freshness
from rdmaplane.services.agent.http import HttpServer, Response
from rdmaplane.services.agent.metrics import AgentMetrics, NodeView
from rdmaplane.services.agent.policy import desired
from rdmaplane.services.agent.policy.decider import (
    Announcement,
    NodeReading,
    PoolFacts,
    PublishInputs,
    TopologyFacts,
    health_flip,
    pool_changes,
    pool_facts,
    ports_in_service,
)
from rdmaplane.services.agent.policy.health import (
    Transition,
    reported_by_hca,
    reported_by_port,
    step,
)
from rdmaplane.services.agent.policy.inventory import Offered, gpu_ids, nrt_object
from rdmaplane.services.agent.publisher import Desired, Publisher
from rdmaplane.services.dra.driver import DraDriver
from rdmaplane.services.dra.metrics import DraCollector

log = logging.getLogger("rdmaplane.services.agent")


class DevicePlugin(Protocol):
    """What the agent needs of the embedded device plugin."""

    def update(
        self, topo: NodeTopology, faults: Mapping[str, str], rails: Mapping[str, int]
    ) -> None: ...
    def recheck(self) -> None: ...
    async def start(self, supervisor: Supervisor) -> None: ...
    async def stop(self) -> None: ...
    def offered(self) -> list[Offered]: ...
    def collect(self) -> Iterator[Metric]: ...  # its own metrics


class AllocationSource(Protocol):
    async def allocations(self) -> Allocations: ...
    async def close(self) -> None: ...


# Why the kernel may refuse to switch the netns mode, said the way an operator can act on it.
NETNS_REFUSALS = {
    errno.EPERM: "the agent needs the NET_ADMIN capability (securityContext.capabilities.add)",
    errno.EBUSY: "the kernel switches only while no network namespace but the initial one "
    "exists, and pods have theirs; switch at boot instead",
    errno.EPROTONOSUPPORT: "this kernel has no RDMA netlink",
}


def configured_agent(config: AgentSettings, pools: PluginSettings) -> Agent:
    """The agent's composition root: the peers `config` runs — the API server client unless
    publishing is off, the embedded device plugin serving `pools` or the DRA driver when
    enabled, PodResources — handed to the agent, which builds the rest."""
    kube = async_client(config.kubeconfig) if config.publish.enabled else None
    plugin = (
        EmbeddedPlugin(pools, kubelet_dir=config.kubelet_dir, dev_root=config.dev_root)
        if config.device_plugin_enabled
        else None
    )
    dra = DraDriver(config, pools.pools, kube) if config.dra.enabled else None
    resources = [config.gpu_resource, *(plugin.resources if plugin else [])]
    return Agent(
        config,
        kube=kube,
        plugin=plugin,
        allocation_source=PodResourcesClient(config.pod_resources_socket, resources),
        pools=pools.pools,
        dra=dra,
    )


class Agent:
    """The agent's shell: given its peers (`configured_agent` picks them), it builds what the
    configuration runs (the publisher only with an API server, the kernel log only when
    configured), does the I/O, keeps what it read in `self.node` and leaves what it means to
    `rdmaplane.services.agent.policy.decider`."""

    def __init__(
        self,
        config: AgentSettings,
        *,
        kube: AsyncClient | None = None,
        plugin: DevicePlugin | None = None,
        allocation_source: AllocationSource | None = None,
        pools: Sequence[Pool] | None = None,
        netlink: RdmaNetlink | None = None,
        dra: DraDriver | None = None,
    ) -> None:
        self.config = config
        # the peers: each present only when the configuration runs it
        self.plugin, self.dra, self.allocation_source = plugin, dra, allocation_source
        self.netlink = netlink or RdmaNetlink()
        # the device plugin's pools (also when another process serves them): their GID policy
        # gives the NCCL_IB_GID_INDEX pods get, and so the node's gid-index label; shared ones
        # need shared RDMA netns mode
        self.pools = tuple(pools if pools is not None else PluginSettings().pools)
        self.policy, self.scope = self._topology_manager()
        health = config.health
        self._rules = rule_table(
            health.window_s,
            health.thresholds,
            config.fault.fatal_thresholds,
            hourly=health.hourly_thresholds,
            hourly_fatal=config.fault.hourly_fatal_thresholds,
            flaps_per_hour=health.flaps_per_hour,
        )
        self.kernel_log = (
            KernelLog(health.kernel_log, health.window_s) if health.kernel_log else None
        )
        self.fabric = FabricSource(config.fabric, config.node_name)
        self.metrics = self._metrics_registry()
        self.publisher = (
            Publisher(kube, config.node_name, config.publish, self.metrics) if kube else None
        )
        self.faults = FaultActor(
            config.fault,
            self._rules,
            config.node_name,
            kube,
            self.metrics,
            view=self._fault_view,
            node_event=self.publisher.record_event if self.publisher else lambda *_: None,
            event_namespace=config.publish.event_namespace,
        )
        self.http = HttpServer(
            {"/metrics": self._metrics, "/healthz": self._healthz, "/readyz": self._readyz},
            config.metrics_address,
            config.metrics_port,
        )
        restarts = self.metrics.task_restarts
        self.tasks = Supervisor(on_restart=lambda name: restarts.labels(name).inc())
        # what was read, and what was last passed on (so only changes are)
        self.node = NodeReading()
        self._probe: Probe | None = None
        self._facts: TopologyFacts | None = None
        self._plugin_fed: tuple[NodeTopology, dict[str, str], dict[str, int]] | None = None
        self._published_from: PublishInputs | None = None
        self._told_pools: PoolFacts | None = None
        self._allocation_problem: str | None = None
        self.condition: desired.Condition | None = None
        self._poll_now = asyncio.Event()
        self.ready = asyncio.Event()

    def _metrics_registry(self) -> AgentMetrics:
        """The agent's metrics, with the embedded plugin's and the DRA driver's when they run."""
        metrics = AgentMetrics(self.view)
        if self.plugin is not None:
            metrics.registry.register(self.plugin)
        if self.dra is not None:
            metrics.registry.register(DraCollector(self.dra))
        return metrics

    @property
    def root(self) -> str:
        return str(self.config.sysfs_root)

    @property
    def topo(self) -> NodeTopology | None:
        return self.node.topo

    # ---------------------------------------------------------------- lifecycle

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until `stop` is set; then stop the tasks, the device plugin and the HTTP
        server. Each long task is one `self.tasks.spawn(name, loop)` line."""
        port = await self.http.start()
        log.info("serving /metrics, /healthz, /readyz on %s:%d", self.config.metrics_address, port)
        try:
            await self.discover("start")
            if self.config.fix_netns_mode:
                await self.fix_netns_mode()
            if self.plugin is not None:
                await self.plugin.start(self.tasks)
            if self.dra is not None:
                await self.dra.start(self.tasks)
            self.ready.set()
            self.tasks.spawn("poll", self._poll_loop)
            if self.config.state_poll_interval_s is not None:
                self.tasks.spawn("states", self._state_loop)
            if self.allocation_source is not None:
                await self.refresh_allocations()
                self.tasks.spawn("allocations", self._allocation_loop)
            if self.publisher is not None:
                self._publish(self._offered())
                self.tasks.spawn("publish", self.publisher.run)
                self.tasks.spawn("faults", self.faults.run)
            await stop.wait()
            log.info("shutting down")
        finally:
            await self.tasks.close()
            if self.plugin is not None:
                await self.plugin.stop()
            if self.dra is not None:
                await self.dra.stop()
            if self.allocation_source is not None:
                await self.allocation_source.close()
            if self.kernel_log is not None:
                self.kernel_log.close()
            await self.http.close()

    async def _poll_loop(self) -> None:
        """A poll every interval, at once when the state check calls, and when pending fatal
        symptoms have persisted `fatalAfter` (so the fault is raised then, not a poll later)."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poll_now.wait(), self._next_poll_in())
            self._poll_now.clear()
            await self.poll()

    def _next_poll_in(self) -> float:
        now = time.monotonic()
        due = self.node.polled_at + self.config.poll_interval_s
        fatal = self.faults.state.due(self.faults.fault_rules)
        return max(0.0, min(due, fatal if fatal is not None else due) - now)

    async def _state_loop(self) -> None:
        """The ports' states every `state_poll_interval_s` (a few small reads): a port that
        changed since the last poll calls the next poll now."""
        assert self.config.state_poll_interval_s is not None
        while True:
            await asyncio.sleep(self.config.state_poll_interval_s)
            if self._states_changed():
                self._poll_now.set()

    def _states_changed(self) -> bool:
        return self._probe is not None and self._probe.states() != self.node.port_states

    async def _allocation_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.allocation_interval_s)
            await self.refresh_allocations()

    # ---------------------------------------------------------------- discovery and health

    async def discover(self, trigger: str) -> None:
        """A full read of the node, in a thread (tens of ms on a big node, off the event loop),
        settled with the new probe's first reading (see `settle`)."""
        started = time.perf_counter()
        settled = await settle(
            lambda: asyncio.to_thread(read_node, self.root, netlink=self.netlink.netns_mode),
            lambda topo: Probe(self.root, topo, self._rules.counters),
        )
        self.metrics.discovery_seconds.observe(time.perf_counter() - started)
        self.metrics.discoveries.labels(trigger).inc()
        if trigger != "start":
            log.info("node changed (%s): rediscovered %d HCAs", trigger, len(settled.topo.hcas))
        self.node.topo, self._probe = settled.topo, settled.probe
        self.node.fabric = await asyncio.to_thread(self.fabric.read, settled.topo)
        self.node.discovered_at = self.node.polled_at = time.monotonic()
        self.node.port_states = settled.reading.states
        self._observe(settled.reading, settled.fingerprint)

    async def poll(self) -> None:
        """Probe; rediscover if something changed; step the health monitor; pass changes on."""
        assert self._probe is not None and self.topo is not None
        started = time.perf_counter()
        reading = self._probe.read()
        self.node.port_states = reading.states
        self.metrics.poll_seconds.observe(time.perf_counter() - started)
        self.node.polled_at = time.monotonic()
        stale = time.monotonic() - self.node.discovered_at >= self.config.rediscover_interval_s
        if reading.fingerprint != self.node.fingerprint or stale:
            await self.discover("changed" if not stale else "periodic")
            return
        self._observe(reading, reading.fingerprint)

    def _observe(self, reading: Reading, fingerprint: tuple[object, ...] | None) -> None:
        """Step the health monitor on a probe reading and pass the result on."""
        self.node.fingerprint = fingerprint
        if self.dra is not None and self.topo is not None:
            # first: the ports in service and the ports the fault classes watch are its devices'
            self.dra.offer(self.topo, self.node.fabric.uplinks)
        kernel = self.kernel_log.read() if self.kernel_log is not None else ()
        self.node.health, transitions = step(
            self.node.health,
            time.monotonic(),
            reading.ports,
            self._rules,
            topology=self.topo,
            offered=self._topology_facts().ports_in_service,
            kernel=kernel,
            quarantined=self.faults.quarantined,
        )
        for t in transitions:
            self._report(t)
        self._feed_plugin()
        offered = self._offered()  # once a poll: the faults and the publisher read the same
        self._observe_faults(reading, kernel, offered)
        if self.dra is not None:
            self.dra.taint(self.faults.state.faults, reported_by_port(self.node.health))
        self._publish(offered)

    def _report(self, t: Transition) -> None:
        """Log, count and (through the publisher) post an Event for one health flip."""
        direction, said = health_flip(t)
        self.metrics.health_transitions.labels(direction).inc()
        self._say(said, hca=t.hca)

    async def fix_netns_mode(self) -> None:
        """`fixNetnsMode`: switch an exclusive-mode node to shared through RDMA netlink, but
        only when no HCA is in another network namespace (an RDMA CNI gave it to a pod, which
        means exclusive mode is in use). Logged and evented either way; rediscovered after."""
        assert self.topo is not None
        if self.topo.netns_mode is not NetnsMode.EXCLUSIVE:
            return
        elsewhere = await asyncio.to_thread(hcas_in_other_namespaces, self.root)
        refused = "not switching the RDMA subsystem to shared network-namespace mode"
        if elsewhere:
            why = f"{', '.join(elsewhere)} {'is' if len(elsewhere) == 1 else 'are'} in other"
            said = f"{refused}: {why} network namespaces (RDMA CNI?)"
            self._say(Announcement(False, "RDMANetnsModeKept", said))
            return
        try:
            await asyncio.to_thread(self.netlink.set_netns_mode, NetnsMode.SHARED)
        except NetlinkError as e:
            hint = NETNS_REFUSALS.get(e.errno or 0)
            said = f"{refused}: the kernel refused ({e.strerror}){f'; {hint}' if hint else ''}"
            self._say(Announcement(False, "RDMANetnsModeKept", said))
            return
        said = "switched the RDMA subsystem from exclusive to shared network-namespace mode"
        self._say(Announcement(True, "RDMANetnsModeShared", f"{said} (fixNetnsMode)"))
        await self.discover("changed")

    def _say(self, said: Announcement, **extra: str) -> None:
        """Log, and post a Node Event when it has a reason (Normal when good, else Warning)."""
        log.log(logging.INFO if said.good else logging.WARNING, said.message, extra=extra or None)
        if said.reason is not None and self.publisher is not None:
            kind = "Normal" if said.good else "Warning"
            self.publisher.record_event(kind, said.reason, said.message)

    def _feed_plugin(self) -> None:
        if self.plugin is None or self.topo is None:
            return
        fed = (self.topo, reported_by_hca(self.node.health), self.node.fabric.rails)
        if fed != self._plugin_fed:  # the same topology object compares by identity: cheap
            self.plugin.update(*fed)
            self._plugin_fed = fed
        else:
            self.plugin.recheck()  # device nodes that came or went

    def _observe_faults(
        self, reading: Reading, kernel: Sequence[KernelEvent], offered: Sequence[Offered]
    ) -> None:
        """Fault classes and whom they hurt (docs/faults.md); the actor's task does the rest."""
        assert self.topo is not None
        self.faults.watch(self.topo, self.managed(offered))
        allocations = self.node.allocations
        resources = {r for p in allocations.pods for r in p.devices}
        self.faults.observe(
            self.topo,
            reading.ports,
            self.node.health,
            offered,
            allocations,
            resources - {self.config.gpu_resource},
            kernel,
        )

    def _topology_facts(self) -> TopologyFacts:
        """What the current topology means for the pools and the ports in service; worked out
        once per topology."""
        topo = self.topo
        assert topo is not None
        if self._facts is None or self._facts.topo is not topo:
            dra_hcas = self.dra.hcas() if self.dra is not None else None
            self._facts = TopologyFacts(
                topo, pool_facts(topo, self.pools), ports_in_service(topo, self.pools, dra_hcas)
            )
        return self._facts

    def _fault_view(self) -> Freshness:
        failures = self.publisher.failures if self.publisher is not None else 0
        return Freshness(failures, self.node.allocations_at, self.config.allocation_interval_s)

    # ---------------------------------------------------------------- allocations

    async def refresh_allocations(self) -> None:
        assert self.allocation_source is not None
        try:
            allocations = await self.allocation_source.allocations()
        except PodResourcesError as e:
            self.metrics.podresources_errors.inc()
            if str(e) != self._allocation_problem:
                log.warning("%s; keeping the last known allocations", e)
                self._allocation_problem = str(e)
            return
        self.node.allocations_at = time.monotonic()
        if self._allocation_problem is not None:
            log.info("PodResources answers again")
            self._allocation_problem = None
        if allocations != self.node.allocations:
            self.node.allocations = allocations
            self._publish(self._offered())

    # ---------------------------------------------------------------- publishing

    def _offered(self) -> list[Offered]:
        """What the embedded device plugin tells the kubelet (built anew on each call)."""
        return self.plugin.offered() if self.plugin is not None else []

    def managed(self, offered: Sequence[Offered]) -> list[str]:
        """The HCAs offered to pods: the device plugin's (`offered`) or the DRA driver's, else
        every HCA with a PCI function."""
        if self.plugin is not None:
            return sorted({n for o in offered for n in o.hcas})
        if self.dra is not None:
            return self.dra.hcas()
        return [h.name for h in self.topo.hcas if h.pci is not None] if self.topo else []

    def desired(self) -> Desired:
        return self._desired(self._offered())

    def _desired(self, offered: Sequence[Offered]) -> Desired:
        assert self.topo is not None
        topo, health = self.topo, self.node.health.hcas
        facts = self._topology_facts().pools
        managed = self.managed(offered)
        return Desired(
            labels=desired.owned_labels(
                {
                    **nrt.node_labels(topo, gid_index=facts.gid_index),
                    **self.node.fabric.labels,
                    **self.faults.node_labels(),
                },
                (*self.fabric.owned_keys, FAULT_SINCE_LABEL),
            ),
            annotations={
                desired.ANNOTATION_TOPOLOGY: desired.topology_annotation(
                    topo, health, gpu_ids(topo)
                )
            },
            condition=desired.rdma_ready(managed, health, facts.gid_problem, facts.netns_problem),
            nrt=nrt_object(
                self.config.node_name,
                topo,
                offered,
                health,
                self.node.allocations,
                gpu_resource=self.config.gpu_resource,
                policy=self.policy,
                scope=self.scope,
                uplinks=self.node.fabric.uplinks,
                pools=list(self.pools),
            ),
        )

    def _publish(self, offered: Sequence[Offered]) -> None:
        """Recompute the desired state when one of its inputs changed, and hand it over."""
        if self.topo is None:
            return
        inputs = PublishInputs(
            self.topo,
            self.node.health.hcas,
            self.node.allocations,
            offered,
            self.node.fabric,
            self.faults.faulty_since,
        )
        if inputs == self._published_from:
            return
        self._published_from = inputs
        desired = self._desired(offered)
        self.condition = desired.condition
        facts = self._topology_facts().pools
        for said in pool_changes(self._told_pools, facts, self.topo.netns_mode):
            self._say(said)
        self._told_pools = facts
        if self.publisher is not None:
            self.publisher.set_desired(desired)

    def _topology_manager(self) -> tuple[str, str]:
        policy, scope, problem = read_kubelet_topology_manager(self.config.kubelet_config_path)
        given_policy, given_scope = (
            self.config.topology_manager_policy,
            self.config.topology_manager_scope,
        )
        if problem and not (given_policy and given_scope):
            log.warning(problem)
        return given_policy or policy, given_scope or scope

    # ---------------------------------------------------------------- HTTP

    def view(self) -> NodeView:
        return NodeView(
            self.root,
            self.topo,
            self.node.health.hcas,
            self.condition.status if self.condition else None,
        )

    def _metrics(self) -> Response:
        return Response(200, generate_latest(self.metrics.registry), CONTENT_TYPE_LATEST)

    def _healthz(self) -> Response:
        down = self.tasks.down
        if down:
            lines = "".join(f"task {name} is down: {fault}\n" for name, fault in down.items())
            return Response(503, lines.encode())
        limit = max(3 * self.config.poll_interval_s, 30.0)
        polled_at = self.node.polled_at
        age = time.monotonic() - polled_at
        if polled_at and age > limit:
            return Response(503, f"last poll {age:.0f} s ago\n".encode())
        return Response(200, b"ok\n")

    def _readyz(self) -> Response:
        if not self.ready.is_set():
            return Response(503, b"discovering\n")
        return Response(200, b"ready\n")
