"""The node agents KWOK does not run, stood in for by the bench: as a watch of an arm's pods
sees one bound or gone, its node's pods are replayed through the kubelet harness
(`replay.ReplayedKubelet`) and the NRT the agent would publish then is written to the API
server."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Mapping, Sequence
from typing import Any

from lightkube.resources.core_v1 import Node, Pod
from lightkube.types import PatchType

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.core import nrt
from rdmaplane.services.agent.publisher import FREED_ANNOTATION
from rdmaplane.services.scheduler.cache import pod_key
from tests.e2e import fleet

from .replay import RailEvent, ReplayedKubelet, Step
from .rig import PLACED_WITHIN_S, RealArm

Published = list[tuple[int, dict[str, Any]]]  # (how many events had happened, the NRT)


class LiveAgents:
    """The node agents KWOK does not run: from a watch of the arm's pods, each node's binds and
    ends replayed through the kubelet harness, and the NRT its agent would publish then written
    to the API server, after the watch shows the change (as an agent does after PodResources
    changes); a node that changed again meanwhile is published once, with all of it, and an
    NRT that frees devices stamps the Node (`FREED_ANNOTATION`), as the agent's does. On
    leaving, the agents catch up with `events`, and every node they wrote gets its empty NRT
    back (the next arm starts as this one did)."""

    def __init__(
        self, arm: RealArm, kubelet: ReplayedKubelet, nodes: list[fleet.FleetNode],
        events: Sequence[RailEvent],
    ) -> None:  # fmt: skip
        self.kube, self.namespace = arm.kube, arm.namespace
        self.kubelet, self.events = kubelet, events
        self.empty = {n.name: n.nrt for n in nodes}
        self.steps: dict[str, list[Step]] = {}  # per node, as short as leaves it as it is
        self.seen = 0  # steps the watch delivered
        self.dirty: dict[str, None] = {}  # nodes to publish, in the order they changed
        self.busy = False
        self.changed, self.progress = asyncio.Event(), asyncio.Event()
        self.published: Published = []
        self.written: set[str] = set()
        self.last: dict[str, Mapping[str, Any]] = {}  # per node, the NRT last written
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> LiveAgents:
        self._tasks = [asyncio.create_task(self._watch()), asyncio.create_task(self._publish())]
        return self

    async def __aexit__(self, *_: object) -> None:
        try:
            async with asyncio.timeout(PLACED_WITHIN_S):
                while not self._caught_up():
                    self.progress.clear()
                    waiter = asyncio.ensure_future(self.progress.wait())
                    # a task that failed sets no progress: wake for it too (`_caught_up` raises)
                    await asyncio.wait([waiter, *self._tasks], return_when=asyncio.FIRST_COMPLETED)
                    waiter.cancel()
        except TimeoutError:
            happened = sum(bool(e.node) for e in self.events)
            raise RuntimeError(
                f"the stand-in agents did not catch up in {PLACED_WITHIN_S:.0f} s: the watch "
                f"saw {self.seen} of {happened} binds and ends, {len(self.dirty)} nodes unwritten"
            ) from None
        finally:
            for t in self._tasks:
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t
        await fleet.bounded(
            fleet.CREATE_PARALLEL,
            (functools.partial(self._write, n, self.empty[n]) for n in self.written),
        )

    def _caught_up(self) -> bool:
        if any(t.done() for t in self._tasks):  # one failed: say why
            next(t for t in self._tasks if t.done()).result()
        happened = sum(bool(e.node) for e in self.events)
        return self.seen >= happened and not self.dirty and not self.busy

    async def _watch(self) -> None:
        where: dict[str, str] = {}  # pod key -> its node
        async for kind, pod in self.kube.watch(Pod, namespace=self.namespace):
            body = pod.to_dict()
            key, node = pod_key(body), (pod.spec.nodeName if pod.spec else None) or ""
            if kind == "DELETED" and key not in where and node:  # bound and gone unseen
                self._changed(node, (True, body))
                self._changed(node, (False, body))
            elif kind == "DELETED" and key in where:
                self._changed(where.pop(key), (False, body))
            elif kind != "DELETED" and node and key not in where:
                where[key] = node
                self._changed(node, (True, body))

    def _changed(self, node: str, step: Step) -> None:
        self.steps.setdefault(node, []).append(step)
        self.seen += 1
        self.dirty[node] = None
        self.changed.set()
        self.progress.set()

    async def _publish(self) -> None:
        while True:
            await self.changed.wait()
            self.changed.clear()
            while self.dirty:
                node = next(iter(self.dirty))
                del self.dirty[node]
                self.busy = True
                steps = list(self.steps[node])
                obj, shorter = await asyncio.to_thread(self._nrt_after, node, steps)
                self.steps[node][: len(steps)] = shorter  # any that came meanwhile stay after
                await self._write(node, obj)
                self.published.append((len(self.events), obj))
                self.busy = False
                self.progress.set()

    def _nrt_after(self, node: str, steps: list[Step]) -> tuple[dict[str, Any], list[Step]]:
        """The node's NRT after `steps`, and steps as short as can be that leave it so."""
        if steps[-1][0]:
            self.kubelet.hold(node, steps)
        else:  # a pod ended: the node's history may shrink
            steps = self.kubelet.compact(node, steps)
        return self.kubelet.nrt(), steps

    async def _write(self, node: str, obj: Mapping[str, Any]) -> None:
        """Write the node's NRT; when it frees devices, stamp the Node as the agent does (so
        kube-scheduler looks again at the pods the extender refused meanwhile)."""
        body = {k: v for k, v in obj.items() if k not in ("apiVersion", "kind", "metadata")}
        await self.kube.patch(NodeResourceTopology, node, body, patch_type=PatchType.MERGE)
        before = self.last.get(node, self.empty[node])
        self.last[node] = obj
        self.written.add(node)
        if nrt.frees(nrt.from_object(before), nrt.from_object(obj)):
            stamp = {FREED_ANNOTATION: f"{time.time():.6f}"}
            await self.kube.patch(
                Node, node, {"metadata": {"annotations": stamp}}, patch_type=PatchType.MERGE
            )
