"""The fault chain's timings on a real control plane, step by step (median of repeated runs).

Usage: python bench/fault.py [--runs 5] [--fatal-after 1] [--grace 2]
       python bench/fault.py --storm [--nodes 200] [--leaves 8] [--per-minute 10] [--window 10]

Starts etcd, kube-apiserver, kube-controller-manager (Job + taint eviction), KWOK and, per run,
kube-scheduler with the rdmaplane extender, from the e2e fixtures' code (`make k8s-bins`
first). Each run is the e2e scenario (tests/e2e/faultrig.py): examples/indexed-job.yaml with one
pod per node, the agent for node A on the HGX sample tree, as deployed (its RBAC, the own-node
admission policies, the token of its DaemonSet pod on A: tests/e2e/nodeaccess.py); a port
under A's pod goes down and a watch timestamps what follows, up to the replacement pod Running
on the spare node:

  fault notice  the rdmaplane.io/fault annotation   (includes fault.fatalAfter and one poll)
  condition     RDMAFault=True                       (includes fault.graceSeconds)
  eviction      DisruptionTarget (Eviction API)
  pod failed    phase Failed (KWOK standing in for the kubelet)
  replacement   the Job controller's new pod         (includes its pod-recreation backoff)
  bound         spec.nodeName (kube-scheduler + extender)
  running       phase Running (KWOK)

Each step's time is from the step before; the fault timings are short by default so the
agent's own overhead shows (subtract fatalAfter and graceSeconds from the first two steps).

`--storm` is the blast-radius breaker's scenario (docs/faults.md): etcd and kube-apiserver only,
`--nodes` Nodes in `--leaves` leaves with their NRTs; every node of one leaf turns faulty at
once (its `rdmaplane.io/fault-since` label) and each asks the fault budget for a token as its
agent's actor does (`rdmaplane.services.agent.breaker.FaultBudget`, the real Lease, asked again
after
the actor's retry of 10 s) until it is given one: the act. Printed: when the breaker opened and
closed, and the acts per minute. The agents here are their budgets alone (no pods, no
health monitor): what is measured is the budget on the real API server.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code lives under tests/

from lightkube import codecs  # noqa: E402
from lightkube.models.meta_v1 import ObjectMeta  # noqa: E402
from lightkube.resources.core_v1 import Namespace, ServiceAccount  # noqa: E402

from rdmaplane.adapters.discovery import read_node, samples  # noqa: E402
from rdmaplane.core.settings.agent import FaultSettings  # noqa: E402
from tests.e2e import faultrig, nodeaccess  # noqa: E402
from tests.e2e.controlplane import (  # noqa: E402
    KubeCluster,
    Process,
    build_dir,
    control_plane,
    launch_controller_manager,
    launch_kwok,
    launch_scheduler,
)
from tests.e2e.test_agent import POLL_S  # noqa: E402

STEPS = ("fault notice", "condition", "eviction", "pod failed", "replacement", "bound", "running")


def has(kind: str) -> Any:
    """A test on one recorded pod version."""
    return {
        "fault notice": lambda v: faultrig.NOTICE in (v["metadata"].get("annotations") or {}),
        "condition": lambda v: faultrig.condition_true(v, "RDMAFault") is not None,
        "eviction": lambda v: faultrig.condition_true(v, "DisruptionTarget") is not None,
        "pod failed": lambda v: v.get("status", {}).get("phase") == "Failed",
        "replacement": lambda v: True,
        "bound": lambda v: bool(v["spec"].get("nodeName")),
        "running": lambda v: v.get("status", {}).get("phase") == "Running",
    }[kind]


async def one_run(
    cluster: KubeCluster, url: str, fault: FaultSettings, **intervals: float | None
) -> dict[str, float]:
    namespace = f"bench-{time.monotonic_ns() % 10**8}"
    with cluster.client() as client:
        client.create(Namespace(metadata=ObjectMeta(name=namespace)))
        client.create(ServiceAccount(metadata=ObjectMeta(name="default", namespace=namespace)))
    schedulers: list[Process] = []
    workdir = Path(tempfile.mkdtemp(prefix="rpf-"))
    try:
        tree = workdir / "sys"
        samples.build(samples.load(faultrig.SAMPLE).spec, tree)
        topo = read_node(str(tree))
        async with (
            cluster.async_client() as kube,
            faultrig.pod_resources_server(workdir / "kubelet", topo) as lister,
            faultrig.fault_rig(
                kube,
                namespace,
                lambda node: nodeaccess.kubeconfig_on(cluster, node),
                tree,
                workdir,
                lister,
                lambda config: schedulers.append(launch_scheduler(cluster, config)),
                url,
                fault=fault,
                **intervals,
            ) as (rig, _),
        ):
            await faultrig.start_job(rig)
            placed = await faultrig.placed_on(rig, {rig.a, rig.b})
            victim = next(p for p, n in placed.items() if n == rig.a)
            spare = await faultrig.add_spare(rig)
            down = time.monotonic()
            rig.port("mlx5_3", up=False)
            after = await faultrig.placed_on(rig, {spare, rig.b})
            replacement = next(p for p, n in after.items() if n == spare)
            times = {"port down": down}
            for step in STEPS:
                pod = victim if step in STEPS[:4] else replacement
                at = rig.first(has(step), pod)
                assert at is not None, f"{step}: not seen"
                times[step] = at
            return times
    finally:
        for process in schedulers:
            process.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def report(runs: list[dict[str, float]], fault: FaultSettings, poll: float, states: str) -> None:
    print(
        f"fault chain, {len(runs)} runs (fatalAfter {fault.fatal_after_s:g} s, graceSeconds "
        f"{fault.grace_s:g} s, agent poll {poll:g} s, state poll {states}); median [min-max] "
        "seconds"
    )
    print(f"{'step':<14} {'from the step before':>26} {'from port down':>22}")
    before = "port down"
    for step in STEPS:
        gaps = [r[step] - r[before] for r in runs]
        totals = [r[step] - r["port down"] for r in runs]
        print(
            f"{step:<14} {statistics.median(gaps):>10.2f} [{min(gaps):5.2f}-{max(gaps):5.2f}]"
            f"     {statistics.median(totals):>10.2f} [{min(totals):5.2f}-{max(totals):5.2f}]"
        )
        before = step


STORM_RETRY_S = 10.0  # the actor asks a refused budget again after its retry (faults.DecisionRules)


async def storm(cluster: KubeCluster, args: argparse.Namespace) -> None:
    from lightkube.resources.core_v1 import Node

    from rdmaplane.adapters.kube import NodeResourceTopology
    from rdmaplane.core import breaker as B
    from rdmaplane.core.fabric import TOPOGRAPH_TIER
    from rdmaplane.core.names import FAULT_SINCE_LABEL
    from rdmaplane.core.settings.agent import BreakerSettings
    from rdmaplane.services.agent.breaker import FaultBudget
    from tests.e2e import fleet

    per_leaf = args.nodes // args.leaves
    planned = fleet.plan(args.nodes, seed=27, prefix="storm")
    config = BreakerSettings(
        max_nodes_per_minute=args.per_minute, window_s=args.window, namespace="default"
    )
    async with cluster.async_client() as kube:

        async def make(i: int, node: fleet.FleetNode) -> None:
            labels = {TOPOGRAPH_TIER.format(0): f"leaf-{i // per_leaf}"}
            await kube.create(Node(metadata=ObjectMeta(name=node.name, labels=labels)))
            await kube.create(NodeResourceTopology(dict(node.nrt)))

        jobs = [lambda i=i, n=n: make(i, n) for i, n in enumerate(planned)]
        await fleet.bounded(20, jobs)
        hurt = [n.name for n in planned[:per_leaf]]
        start = time.time()
        patch = {"metadata": {"labels": {FAULT_SINCE_LABEL: str(int(start))}}}
        await fleet.bounded(20, [lambda n=n: kube.patch(Node, n, patch) for n in hurt])
        changes: list[tuple[float, B.Change]] = []
        acted: dict[str, float] = {}

        async def agent(name: str) -> None:
            budget = FaultBudget(kube, name, config)
            while True:
                answer, said = await budget.take()
                changes.extend((time.time() - start, c) for c in said)
                if answer.verdict == B.BudgetVerdict.GRANTED:
                    acted[name] = time.time() - start
                    return
                await asyncio.sleep(STORM_RETRY_S)

        await asyncio.gather(*(agent(n) for n in hurt))
    report_storm(args, len(hurt), changes, acted)


def report_storm(
    args: argparse.Namespace, hurt: int, changes: list[tuple[float, Any]], acted: dict[str, float]
) -> None:
    opened = [(t, c.scope) for t, c in changes if c.opened]
    closed = min((t for t, c in changes if not c.opened), default=float("nan"))
    per_minute = [0] * (int((max(acted.values()) - closed) // 60) + 1 if opened else 1)
    for t in acted.values():
        per_minute[int((t - closed) // 60) if opened else 0] += 1
    print(
        f"storm: {hurt} of {args.nodes} nodes (one of {args.leaves} leaves) faulty at once; "
        f"maxNodesPerMinute {args.per_minute}, window {args.window:g} s, retry {STORM_RETRY_S:g} s"
    )
    scopes = ", ".join(scope for _, scope in opened)
    print(
        f"breaker opened at {min(t for t, _ in opened):.2f} s ({scopes})"
        if opened
        else "never opened"
    )
    early = sum(t < closed for t in acted.values())
    print(f"breaker closed at {closed:.2f} s; acts while open: {early}")
    once = len(acted) == hurt
    print(f"acts per minute from the close: {per_minute}; every hurt node acted once: {once}")
    print(f"last act at {max(acted.values()):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fatal-after", type=float, default=1.0)
    parser.add_argument("--grace", type=float, default=2.0)
    parser.add_argument("--poll", type=float, default=POLL_S, help="the agent's pollInterval")
    parser.add_argument(
        "--state-poll", type=float, default=0.0, help="statePollInterval (0: off, the default here)"
    )
    parser.add_argument("--storm", action="store_true", help="the blast-radius breaker's scenario")
    parser.add_argument("--nodes", type=int, default=200)
    parser.add_argument("--leaves", type=int, default=8)
    parser.add_argument("--per-minute", type=int, default=10)
    parser.add_argument("--window", type=float, default=10.0)
    args = parser.parse_args()
    if args.storm:
        with control_plane(build_dir("--bin-dir")) as cluster:
            with cluster.client() as client:
                for obj in codecs.load_all_yaml(
                    (REPO / "deploy/crds/noderesourcetopology.yaml").read_text()
                ):
                    client.apply(obj, force=True)
            time.sleep(2)  # the CRD becomes Established
            asyncio.run(storm(cluster, args))
        return
    fault = replace(faultrig.FAULT, fatal_after_s=args.fatal_after, grace_s=args.grace)
    bin_dir, kwok_bin = build_dir("--bin-dir"), build_dir("--kwok-bin-dir") / "kwok"
    missing = [str(p) for p in (bin_dir / "kube-controller-manager", kwok_bin) if not p.is_file()]
    if missing:
        sys.exit(f"bench/fault.py: {', '.join(missing)} missing: run `make k8s-bins` first")
    with control_plane(bin_dir) as cluster:
        with cluster.client() as client:
            for obj in codecs.load_all_yaml(
                (REPO / "deploy/crds/noderesourcetopology.yaml").read_text()
            ):
                client.apply(obj, force=True)
        nodeaccess.install(cluster)
        time.sleep(2)  # the CRD becomes Established
        kcm, kwok = launch_controller_manager(cluster), launch_kwok(cluster, kwok_bin)
        try:
            with faultrig.serve_extender(cluster) as url:
                intervals = {
                    "poll_interval_s": args.poll,
                    "state_poll_interval_s": args.state_poll or None,
                }
                runs = [
                    asyncio.run(one_run(cluster, url, fault, **intervals)) for _ in range(args.runs)
                ]
        finally:
            kwok.stop()
            kcm.stop()
    report(runs, fault, args.poll, f"{args.state_poll:g} s" if args.state_poll else "off")


if __name__ == "__main__":
    main()
