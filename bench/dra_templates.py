"""What each shipped claim template costs the real kube-scheduler per pod, as a multiple of a
one-GPU claim's in the same run: issue 42's goal of at most 8×, judged by kube-scheduler itself
(tests/dra_allocator judges the allocator alone, per node and state).

    .venv/bin/python bench/dra_templates.py [--nodes 100] [--rounds 2] [--fill 0.4]
                                            [--templates one-gpu gpu-nic-pcie-x1 ...]

One control plane (etcd, kube-apiserver, KWOK; `make k8s-bins` first) with a fleet of KWOK GPU
nodes from the bundled samples, each carrying the slice rdmaplane's DRA driver publishes for it
and its GPUs as NVIDIA's GPU DRA driver does (tests/e2e/drafleet.py, as bench/cluster.py);
kube-controller-manager's resourceclaim controller makes the claims. Rounds alternate the
templates: per round and template, in a fresh namespace, pods asking that template, enough of
them to take --fill of the fleet's GPUs, are created with their claims and a scheduling gate;
kube-scheduler starts, configured by deploy/dra/kube-scheduler-config.yaml, its CPU is read,
the gates are lifted, and it schedules them all: the nodes
go from free through partly taken and one device short to full, as the pods fill them. The
figure is kube-scheduler's CPU time from the gates' lifting to the last binding (or --stall seconds
without one) per bound pod, and its ratio to the one-GPU claim's of the same round (the median
over rounds). The rail templates (examples/dra-rails.yaml) are not in the default list: this
fleet's slices name no rails (no fabric source runs beside a KWOK node), so no node fits them.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code lives under tests/

from cluster import cluster_with_kwok, tuned_config, usage  # noqa: E402
from lightkube import AsyncClient  # noqa: E402
from lightkube.resources.core_v1 import Pod  # noqa: E402
from lightkube.resources.resource_v1 import ResourceClaimTemplate  # noqa: E402
from lightkube.types import PatchType  # noqa: E402

from tests.dra_allocator.harness import ONE_GPU, TEMPLATE_FILES, claim_specs, templates  # noqa: E402
from tests.e2e import drafleet, fleet, scalerig  # noqa: E402
from tests.e2e.controlplane import (  # noqa: E402
    KubeCluster,
    build_dir,
    launch_controller_manager,
    launch_scheduler,
)
from tests.e2e.dra import ensure_device_classes  # noqa: E402

# GPUs a pod of each template takes on the fleet's nodes (every sample there has eight).
GPUS = {
    ONE_GPU: 1,
    "gpu-nic-pcie-x1": 1,
    "gpu-nic-pcie-x2": 2,
    "gpu-nic-numa-x4": 4,
    "gpu-nic-node-x8": 8,
    "gpu-nic-node": 8,
}
QPS = 1000
GATE = "bench.rdmaplane.io/hold"  # lifted once kube-scheduler runs and its CPU is read


@dataclass(frozen=True)
class Round:
    template: str
    pods: int
    bound: int
    cpu_ms: float  # kube-scheduler's, per bound pod


def template_body(name: str, spec: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"spec": spec},
    }


def pod_body(name: str, namespace: str, label: str, template: str) -> dict[str, Any]:
    """The fleet's CPU-only pod, its container given the claim of `template`."""
    body = fleet.pod_body(name, namespace, label, 0)
    body["spec"]["resourceClaims"] = [{"name": "devices", "resourceClaimTemplateName": template}]
    body["spec"]["containers"][0]["resources"] = {"claims": [{"name": "devices"}]}
    body["spec"]["schedulingGates"] = [{"name": GATE}]
    return body


async def one_round(
    cluster: KubeCluster,
    kube: AsyncClient,
    label: str,
    template: str,
    spec: dict[str, Any],
    count: int,
    args: argparse.Namespace,
) -> Round:
    """`count` pods asking `template` (whose claims are `spec`), scheduled at once."""
    namespace = await scalerig.create_namespace(kube, f"t-{template[:40]}")
    body = template_body(template, spec, namespace)
    await kube.create(ResourceClaimTemplate.from_dict(body))  # type: ignore[arg-type]
    pods = [pod_body(f"p-{i:05d}", namespace, label, template) for i in range(count)]
    sent: dict[str, float] = {}
    async with fleet.Bindings(kube, namespace) as seen:
        await scalerig.create_pods(kube, pods, sent)
        await drafleet.wait_for_claims(kube, namespace, count, scalerig.BIND_WITHIN_S)
        scheduler = launch_scheduler(cluster, tuned_config(QPS))
        samples = [(time.monotonic(), usage(scheduler.popen.pid).cpu_s)]
        sampler = asyncio.create_task(sample_cpu(scheduler.popen.pid, samples))
        try:
            await asyncio.gather(*(ungate(kube, namespace, p["metadata"]["name"]) for p in pods))
            unbound = await seen.wait_for(sent, args.within, args.stall)
        finally:
            sampler.cancel()
            scheduler.stop()
    await scalerig.empty(kube, namespace, [], claims=True)
    bound = count - len(unbound)
    last = max((b.at for b in seen.bound.values()), default=samples[0][0])
    # up to the first sample after the last binding: the stall's wait on pods that fit nowhere
    # is left out
    spent = next((cpu for t, cpu in samples if t >= last), samples[-1][1]) - samples[0][1]
    return Round(template, count, bound, 1000 * spent / max(1, bound))


async def ungate(kube: AsyncClient, namespace: str, name: str) -> None:
    remove = [{"op": "remove", "path": "/spec/schedulingGates"}]
    await kube.patch(Pod, name, remove, namespace=namespace, patch_type=PatchType.JSON)


async def sample_cpu(pid: int, into: list[tuple[float, float]], every: float = 0.05) -> None:
    """(monotonic time, the process's CPU seconds) every `every` seconds, until cancelled."""
    while True:
        into.append((time.monotonic(), usage(pid).cpu_s))
        await asyncio.sleep(every)


async def run(cluster: KubeCluster, args: argparse.Namespace) -> list[dict[str, Round]]:
    """The rounds, each its templates' figures by name."""
    label = f"tfleet{args.nodes}"
    nodes = fleet.plan(args.nodes, args.seed, label)
    gpus = sum(int(n.capacity.get(fleet.nrt.GPU, "0")) for n in nodes)
    found: dict[str, dict[str, Any]] = {}
    for path in TEMPLATE_FILES:
        found |= templates(path)
    specs = claim_specs(found)
    rounds: list[dict[str, Round]] = []
    async with cluster.async_client() as kube:
        await fleet.create(kube, nodes)
        await ensure_device_classes(kube)
        await drafleet.create_slices(kube, nodes)
        print(f"== {len(nodes)} KWOK nodes, {gpus} GPUs; pods take {args.fill:.0%} of them")
        claims = launch_controller_manager(
            cluster,
            ("resourceclaim-controller",),
            (f"--kube-api-qps={QPS}", f"--kube-api-burst={2 * QPS}"),
        )
        try:
            for _ in range(args.rounds):
                rounds.append({})
                for template in args.templates:
                    count = max(1, int(args.fill * gpus / GPUS[template]))
                    r = await one_round(
                        cluster, kube, label, template, specs[template], count, args
                    )
                    rounds[-1][template] = r
                    print(
                        f"  {r.template:<20} {r.bound:4d} of {r.pods:4d} pods bound   "
                        f"kube-scheduler CPU {r.cpu_ms:6.2f} ms/pod"
                    )
        finally:
            claims.stop()
    return rounds


def report(rounds: list[dict[str, Round]], names: list[str]) -> None:
    """Per template: the median CPU per pod and the median of each round's ratio to the
    one-GPU claim's."""
    print("  template               CPU/pod (median)   ÷ one-GPU claim (median of rounds)")
    for name in names:
        cpu = statistics.median(r[name].cpu_ms for r in rounds)
        ratios = [r[name].cpu_ms / r[ONE_GPU].cpu_ms for r in rounds if r[ONE_GPU].cpu_ms]
        ratio = f"{statistics.median(ratios):5.2f}x" if ratios else "  n/a"
        print(f"  {name:<20} {cpu:8.2f} ms        {ratio}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=2, help="of each template, alternating")
    parser.add_argument("--fill", type=float, default=0.4, help="share of the fleet's GPUs asked")
    parser.add_argument("--templates", nargs="+", choices=list(GPUS), default=list(GPUS))
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--within", type=float, default=300.0, help="seconds a round waits at most")
    parser.add_argument("--stall", type=float, default=10.0, help="seconds without a binding")
    args = parser.parse_args()
    if ONE_GPU not in args.templates:
        args.templates.insert(0, ONE_GPU)
    bin_dir, kwok_bin = build_dir("--bin-dir"), build_dir("--kwok-bin-dir") / "kwok"
    if not (bin_dir / "kube-apiserver").is_file() or not kwok_bin.is_file():
        sys.exit(
            "bench/dra_templates.py: the control plane's binaries are missing: run `make k8s-bins`"
        )
    with cluster_with_kwok(bin_dir, kwok_bin) as cluster:
        rounds = asyncio.run(run(cluster, args))
    report(rounds, args.templates)


if __name__ == "__main__":
    main()
