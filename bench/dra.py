"""The DRA driver's latencies, measured where the kubelet and the scheduler see them.

Usage: python bench/dra.py [--claims 60] [--flaps 10] [--poll-ms 100] [--dir DIR]

Runs `rdmaplane dra-driver` as its own process on the HGX sample tree (on tmpfs, as /sys is;
the checkpoint and CDI specs too unless `--dir` names a disk: on a node the checkpoint lives
below /var/lib/kubelet, on disk, and every save is an fsync),
against a real kube-apiserver started from the e2e fixtures' code (needs `make k8s-bins`), with
the kubelet's side played by the stand-in of the tests (tests/integration/dra_kubelet.py, built
from the DRA and plugin-registration protos).

1. NodePrepareResources at the stand-in's gRPC client, for claims of 1 and of 8 NIC ports: the
   first call for a claim (the driver reads it from the API server, resolves it, checkpoints it
   as started, writes its CDI spec, checkpoints it as prepared), the same call again (answered
   from the checkpoint), and NodeUnprepareResources. Claims are prepared and unprepared one
   after the other, so the checkpoint stays small, as on a node running a few pods. Their
   allocations are written by this script as the scheduler would write them (no scheduler
   runs, so claims may share devices: the driver prepares what it is told, the scheduler is
   the one that keeps devices exclusive).
2. A port going down and coming back: the time from writing the port's state files to
   - the API server holding the slice with (without) the device's taint, seen by a watch;
   - the API server holding a claim of that device with its binding condition failing
     (`rdmaplane.io/rdma-failed` True; back: `rdmaplane.io/rdma-ready` True), seen by a watch
     (the claim is allocated as kube-scheduler writes it, binding conditions copied from the
     slice; the driver runs with its DaemonSet pod's node-bound token, as deployed);
   - the kubelet's health stream saying the device is UNHEALTHY (HEALTHY), at the stand-in's
     NodeWatchResources client: what the kubelet puts in the pod's allocatedResourcesStatus
     (the kubelet's own step from there to the pod's status is not in this figure).
   Each includes up to one poll interval (`--poll-ms`) of the agent's probe; the fault
   classes' hysteresis is off (`fatalAfter`, `clearAfter` 0 s: with the defaults add 5 s and
   1 min to the fault's taint; the NoSchedule taint, the conditions and the health follow the
   port itself).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the e2e control-plane code and the stand-in live under tests/

from lightkube import AsyncClient, codecs  # noqa: E402
from lightkube.models.meta_v1 import ObjectMeta  # noqa: E402
from lightkube.resources.core_v1 import Node  # noqa: E402
from lightkube.resources.resource_v1 import ResourceClaim, ResourceSlice  # noqa: E402

from rdmaplane.adapters.discovery import samples  # noqa: E402
from rdmaplane.services.dra.policy.readiness import FAILED, READY  # noqa: E402
from tests.e2e.controlplane import KubeCluster, build_dir, control_plane  # noqa: E402
from tests.e2e.dra import (  # noqa: E402
    driver_command,
    driver_kubeconfig_on,
    install_driver_rbac,
)
from tests.integration.dra_kubelet import Claim, DraKubelet  # noqa: E402
from tests.integration.kubelet_standin import device_nodes  # noqa: E402

SAMPLE = "hgx-h100-roce"
DRIVER = "rdma.rdmaplane.io"
NODE = "hgx-h100-017"


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def line(what: str, seconds: list[float]) -> str:
    ms = [s * 1000 for s in seconds]
    return (
        f"  {what:<38} p50 {percentile(ms, 50):7.2f} ms   p99 {percentile(ms, 99):7.2f} ms"
        f"   (n={len(ms)})"
    )


@contextlib.contextmanager
def cluster() -> Iterator[KubeCluster]:
    bin_dir = build_dir("--bin-dir")
    if not (bin_dir / "kube-apiserver").is_file():
        sys.exit(f"no kube-apiserver in {bin_dir}: run `make k8s-bins` first")
    with control_plane(bin_dir) as c:
        with c.client() as client:
            for obj in codecs.load_all_yaml(
                (REPO / "deploy/crds/noderesourcetopology.yaml").read_text()
            ):
                client.apply(obj, force=True)
            client.create(Node(metadata=ObjectMeta(name=NODE)))
        yield c


@contextlib.asynccontextmanager
async def driver(c: KubeCluster, workdir: Path, poll_ms: int) -> AsyncIterator[Path]:
    """The driver process on a copy of the sample tree; yields the tree."""
    tree = workdir / "sys"
    samples.build(samples.load(SAMPLE).spec, tree)
    device_nodes(tree, workdir / "dev")
    install_driver_rbac(c)
    kubeconfig = driver_kubeconfig_on(c, NODE)
    command = driver_command(workdir, tree, NODE, kubeconfig, f"{poll_ms}ms")
    with (workdir / "driver.log").open("wb") as log:
        process = await asyncio.create_subprocess_exec(*command, stdout=log, stderr=log)
    try:
        yield tree
    finally:
        process.terminate()
        await asyncio.wait_for(process.wait(), 15)


async def allocated_claims(
    kube: AsyncClient, devices: list[str], count: int, binding: bool = False
) -> list[Claim]:
    """Claims for `devices`, allocated as the scheduler would write it (`binding`: with the
    binding conditions it copies from the slice and the node selector of bindsToNode)."""
    out = []
    for _ in range(count):
        name = f"bench-{uuid.uuid4().hex[:8]}"
        requests = [
            {"name": f"nic-{k}", "exactly": {"deviceClassName": DRIVER}}
            for k in range(len(devices))
        ]
        body = {
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"devices": {"requests": requests}},
        }
        created = await kube.create(cast(ResourceClaim, ResourceClaim.from_dict(body)))
        results = [
            {"request": f"nic-{k}", "driver": DRIVER, "pool": NODE, "device": d}
            | ({"bindingConditions": [READY], "bindingFailureConditions": [FAILED]}
               if binding else {})
            for k, d in enumerate(devices)
        ]  # fmt: skip
        allocation: dict[str, Any] = {"devices": {"results": results}}
        if binding:
            allocation["nodeSelector"] = {
                "nodeSelectorTerms": [
                    {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [NODE]}]}
                ]
            }
        status = {"status": {"allocation": allocation}}
        await kube.patch(ResourceClaim.Status, name, status, namespace="default")
        assert created.metadata is not None and created.metadata.uid
        out.append(Claim("default", name, created.metadata.uid))
    return out


async def slice_devices(kube: AsyncClient) -> dict[str, dict[str, Any]]:
    out = {}
    async for s in kube.list(ResourceSlice, fields={"spec.nodeName": NODE, "spec.driver": DRIVER}):
        for d in s.to_dict()["spec"].get("devices", []):
            out[d["name"]] = d
    return out


async def prepare_figures(kube: AsyncClient, kubelet: DraKubelet, claims: int) -> None:
    devices = sorted(await slice_devices(kube))
    for size in (1, 8):
        fresh, again, unprepare = [], [], []
        for claim in await allocated_claims(kube, devices[:size], claims):
            for times in (fresh, again):
                started = time.perf_counter()
                answer = (await kubelet.prepare([claim]))[claim.uid]
                times.append(time.perf_counter() - started)
                assert answer.error == "" and len(answer.devices) == size, answer
            started = time.perf_counter()
            assert (await kubelet.unprepare([claim])) == {claim.uid: ""}
            unprepare.append(time.perf_counter() - started)
        print(f"NodePrepareResources, claims of {size} NIC port{'s' if size > 1 else ''}:")
        print(line("first call (API read, spec, saves)", fresh))
        print(line("again (from the checkpoint)", again))
        print(line("NodeUnprepareResources", unprepare))


async def flap_figures(
    kube: AsyncClient, kubelet: DraKubelet, tree: Path, flaps: int, poll_ms: int
) -> None:
    port = tree / "class/infiniband/mlx5_4/ports/1"
    devices = await slice_devices(kube)
    target = next(
        n for n, d in devices.items() if d["attributes"]["rdmaDevice"]["string"] == "mlx5_4"
    )
    (claim,) = await allocated_claims(kube, [target], 1, binding=True)
    # what each watcher saw, as (when, is the device bad)
    seen: dict[str, asyncio.Queue[tuple[float, bool]]] = {
        k: asyncio.Queue() for k in ("taint", "condition", "health")
    }

    async def slices() -> None:
        async for _, obj in kube.watch(ResourceSlice, fields={"spec.nodeName": NODE}):
            for d in obj.to_dict()["spec"].get("devices", []):
                if d["name"] == target:
                    await seen["taint"].put((time.perf_counter(), bool(d.get("taints"))))

    async def claims() -> None:
        async for _, obj in kube.watch(
            ResourceClaim, namespace="default", fields={"metadata.name": claim.name}
        ):
            for d in obj.to_dict().get("status", {}).get("devices") or []:
                said = {c["type"]: c["status"] for c in d.get("conditions", [])}
                if d["device"] == target and said:
                    bad = said.get(FAILED) == "True"
                    await seen["condition"].put((time.perf_counter(), bad))

    async def health() -> None:
        async for report in kubelet.watch_health():
            for h in report:
                if h.device == target:
                    await seen["health"].put((time.perf_counter(), h.health != "HEALTHY"))

    watchers = [asyncio.create_task(w()) for w in (slices, claims, health)]
    times: dict[tuple[str, bool], list[float]] = {}
    try:
        for what in seen:  # settled: every watcher says the device is fine
            while (await asyncio.wait_for(seen[what].get(), 60))[1]:
                pass
        for _ in range(flaps):
            for state, phys, bad in (("1: DOWN", "3: Disabled", True),
                                     ("4: ACTIVE", "5: LinkUp", False)):  # fmt: skip
                for queue in seen.values():
                    while not queue.empty():
                        queue.get_nowait()
                started = time.perf_counter()
                (port / "state").write_text(state + "\n")
                (port / "phys_state").write_text(phys + "\n")
                for what, queue in seen.items():
                    while True:
                        at, is_bad = await asyncio.wait_for(queue.get(), 60)
                        if is_bad == bad:
                            times.setdefault((what, bad), []).append(at - started)
                            break
    finally:
        for w in watchers:
            w.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await w
    print(f"Port change → what the scheduler and the kubelet see (poll interval {poll_ms} ms):")
    print(line("port down → device tainted", times["taint", True]))
    print(line("port up → taint removed", times["taint", False]))
    print(line("port down → claim's rdma-failed True", times["condition", True]))
    print(line("port up → claim's rdma-ready True", times["condition", False]))
    print(line("port down → health UNHEALTHY", times["health", True]))
    print(line("port up → health HEALTHY", times["health", False]))


async def main(args: argparse.Namespace, c: KubeCluster, workdir: Path) -> None:
    async with c.async_client() as kube, driver(c, workdir, args.poll_ms) as tree:
        kubelet = DraKubelet(workdir / "kubelet", DRIVER)
        await kubelet.register(60)
        async with asyncio.timeout(60):
            while True:  # the first publish
                if await slice_devices(kube):
                    break
                await asyncio.sleep(0.1)
        await prepare_figures(kube, kubelet, args.claims)
        await flap_figures(kube, kubelet, tree, args.flaps, args.poll_ms)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=60, help="claims per size")
    parser.add_argument("--flaps", type=int, default=10)
    parser.add_argument("--poll-ms", type=int, default=100)
    parser.add_argument(
        "--dir", type=Path, help="where the tree, checkpoint and CDI specs go (default: tmpfs)"
    )
    arguments = parser.parse_args()
    base = arguments.dir or (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    workdir = Path(tempfile.mkdtemp(prefix="rdra-", dir=base))
    try:
        with cluster() as control:
            asyncio.run(main(arguments, control, workdir))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
