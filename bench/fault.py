"""The fault chain's timings on a real control plane, step by step (median of repeated runs).

Usage: python bench/fault.py [--runs 5] [--fatal-after 1] [--grace 2]

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

from rdmaplane.agent.settings import FaultSettings  # noqa: E402
from rdmaplane.discovery import read_node, samples  # noqa: E402
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


async def one_run(cluster: KubeCluster, url: str, fault: FaultSettings) -> dict[str, float]:
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


def report(runs: list[dict[str, float]], fault: FaultSettings) -> None:
    print(
        f"fault chain, {len(runs)} runs (fatalAfter {fault.fatal_after_s:g} s, graceSeconds "
        f"{fault.grace_s:g} s, agent poll {POLL_S:g} s); median [min-max] seconds"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--fatal-after", type=float, default=1.0)
    parser.add_argument("--grace", type=float, default=2.0)
    args = parser.parse_args()
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
                runs = [asyncio.run(one_run(cluster, url, fault)) for _ in range(args.runs)]
        finally:
            kwok.stop()
            kcm.stop()
    report(runs, fault)


if __name__ == "__main__":
    main()
