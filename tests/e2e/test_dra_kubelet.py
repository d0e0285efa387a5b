"""The driver as it runs on a node: `rdmaplane dra-driver` in its own process on a sample tree,
authenticated as its ServiceAccount with deploy/dra's RBAC, publishing to the real API server;
claims allocated by the real kube-scheduler; the kubelet side played by a stand-in built from
the DRA and plugin-registration protos (tests/integration/dra_kubelet.py)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import shutil
import signal
import subprocess
import tempfile
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from lightkube import ApiError, AsyncClient, codecs
from lightkube.resources.core_v1 import Node
from lightkube.resources.resource_v1 import ResourceClaim, ResourceClaimStatus, ResourceSlice
from lightkube.types import PatchType

from rdmaplane.adapters.kube import async_client
from rdmaplane.core.faults import TAINT_KEY
from rdmaplane.services.dra.policy.claims import spec_name
from rdmaplane.services.dra.policy.devices import PCI_BUS_ID
from rdmaplane.services.dra.policy.readiness import FAILED, READY
from tests.e2e import nodeaccess
from tests.e2e.controlplane import KubeCluster, Process, add_ready_node
from tests.e2e.dra import (
    DRA_DEPLOY,
    DRIVER,
    DRIVER_USER,
    GROUP_LABEL,
    HEALTH_WINDOW,
    SHARED_POOLS,
    WAIT_S,
    allocation,
    bound_node,
    claim_pod,
    driver_command,
    driver_kubeconfig_on,
    ensure_device_classes,
    gpu_slice,
    install_driver_rbac,
    nics,
    pending,
    shares,
    slice_devices,
    templates,
    until,
)
from tests.integration.dra_kubelet import Claim, DraKubelet, Health
from tests.integration.kubelet_standin import device_nodes
from tests.unit.test_dra_claims import CDI

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def driver_rbac(kube_cluster: KubeCluster, nrt_crd: object) -> None:
    install_driver_rbac(kube_cluster)


@dataclass
class DraHost:
    name: str
    group: str
    workdir: Path
    tree: Path

    @property
    def kubelet_dir(self) -> Path:
        return self.workdir / "kubelet"

    @property
    def cdi_dir(self) -> Path:
        return self.workdir / "cdi"

    def set_port(self, hca: str, up: bool) -> None:
        """Port 1 of `hca` ACTIVE/LinkUp or DOWN/Disabled in the driver's sysfs tree."""
        port = self.tree / "class/infiniband" / hca / "ports/1"
        (port / "state").write_text("4: ACTIVE\n" if up else "1: DOWN\n")
        (port / "phys_state").write_text("5: LinkUp\n" if up else "3: Disabled\n")


@pytest.fixture
async def node(
    kube: AsyncClient, sample_trees: dict[str, Path], sample_nodes: dict[str, Any]
) -> AsyncIterator[DraHost]:
    """A Node for the sample hgx-h100-roce with its GPU slice, a copy of its sysfs tree and
    device nodes in a short temporary folder (unix socket paths are limited to 107 bytes)."""
    await ensure_device_classes(kube)
    group = uuid.uuid4().hex[:8]
    name = f"dra-node-{group}"
    await add_ready_node(kube, name, {GROUP_LABEL: group}, {})
    gpus = gpu_slice(name, sample_nodes["hgx-h100-roce"])
    await kube.create(ResourceSlice.from_dict(gpus))  # type: ignore[arg-type]
    workdir = Path(tempfile.mkdtemp(prefix="rdr-"))
    tree = Path(shutil.copytree(sample_trees["hgx-h100-roce"], workdir / "sys", symlinks=True))
    device_nodes(tree, workdir / "dev")
    yield DraHost(name, group, workdir, tree)
    async for s in kube.list(ResourceSlice, fields={"spec.nodeName": name}):
        await kube.delete(ResourceSlice, s.metadata.name)  # type: ignore[union-attr]
    await kube.delete(Node, name)
    shutil.rmtree(workdir, ignore_errors=True)


class DriverProcess:
    """`rdmaplane dra-driver` in its own process, its JSON log lines in a file per run."""

    def __init__(self, node: DraHost, kubeconfig: Path, run: int, **options: Any) -> None:
        self.log = node.workdir / f"driver-{run}.log"
        command = driver_command(node.workdir, node.tree, node.name, kubeconfig, "200ms", **options)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def lines(self) -> list[dict[str, Any]]:
        out = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def start_driver(
    node: DraHost, kube_cluster: KubeCluster, driver_rbac: None
) -> Iterator[Callable[..., DriverProcess]]:
    """Starts the driver for the node with the credential its DaemonSet's pod gets there
    (`options`: driver_command's)."""
    kubeconfig = driver_kubeconfig_on(kube_cluster, node.name)
    runs: list[DriverProcess] = []

    def start(**options: Any) -> DriverProcess:
        runs.append(DriverProcess(node, kubeconfig, len(runs), **options))
        return runs[-1]

    yield start
    for run in runs:
        run.stop()


@pytest.fixture
def scheduler(start_scheduler: Callable[..., Process]) -> Process:
    return start_scheduler()


async def registered(node: DraHost) -> DraKubelet:
    kubelet = DraKubelet(node.kubelet_dir, DRIVER)
    await kubelet.register(WAIT_S)
    return kubelet


async def published(kube: AsyncClient, node: DraHost) -> dict[str, dict[str, Any]]:
    return await until(lambda: slice_devices(kube, node.name), "the driver's slice")


async def allocated_claim(
    kube: AsyncClient, namespace: str, node: DraHost, spec: Mapping[str, Any]
) -> tuple[Claim, list[dict[str, Any]]]:
    _, name = await claim_pod(kube, namespace, node.group, spec)
    results = await allocation(kube, namespace, name)
    stored = await kube.get(ResourceClaim, name, namespace=namespace)
    assert stored.metadata is not None and stored.metadata.uid
    return Claim(namespace, name, stored.metadata.uid), [dict(r) for r in results]


def prepared_lines(runs: list[DriverProcess], uid: str) -> int:
    return sum(
        1
        for run in runs
        for line in run.lines()
        if line.get("uid") == uid and str(line.get("msg", "")).startswith("prepared claim")
    )


async def metrics(driver: DriverProcess) -> dict[str, float]:
    """The driver's /metrics, at the address its log names."""
    served = next(
        line["msg"]
        for line in driver.lines()
        if str(line.get("msg", "")).startswith("serving /metrics")
    )
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://{served.rsplit(' ', 1)[1]}/metrics")).text
    return {
        name: float(value)
        for name, value in (
            line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#"
        )
    }


def spec_of(node: DraHost, uid: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((node.cdi_dir / f"{spec_name(DRIVER, uid)}.json").read_text())
    return data


# ---------------------------------------------------------------- the tests


async def test_registers_and_prepares_exactly_the_allocated_devices(
    kube: AsyncClient,
    namespace: str,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
    scheduler: Process,
) -> None:
    driver = start_driver()
    kubelet = await registered(node)
    assert kubelet.info is not None
    assert kubelet.info.type == "DRAPlugin" and kubelet.info.name == DRIVER
    assert list(kubelet.info.supported_versions) == [
        "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth",
    ]  # fmt: skip
    assert kubelet.service == "v1.DRAPlugin"
    assert kubelet.health_service == "v1.DRAResourceHealth"
    devices = await published(kube, node)
    claim, results = await allocated_claim(
        kube, namespace, node, templates()["gpu-nic-pcie-x2"]["spec"]["spec"]
    )
    ours = {r["request"]: r["device"] for r in results if r["driver"] == DRIVER}

    # two calls for one claim at once: whatever the caller does, a claim is prepared once
    one, two = await asyncio.gather(kubelet.prepare([claim]), kubelet.prepare([claim]))
    first = one[claim.uid]
    assert two[claim.uid] == first

    assert first.error == ""
    assert sorted((d[0], d[2]) for d in first.devices) == sorted(((r,), d) for r, d in ours.items())
    assert all(d[1] == node.name for d in first.devices)
    spec = spec_of(node, claim.uid)
    CDI.validate(spec)
    env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
    hcas = {f"{devices[d]['attributes']['rdmaDevice']['string']}:1" for d in ours.values()}
    assert set(env["NCCL_IB_HCA"].removeprefix("=").split(",")) == hcas
    assert set(env["UCX_NET_DEVICES"].split(",")) == hcas
    kind = spec["kind"]
    assert {i for d in first.devices for i in d[3]} == {
        f"{kind}={d['name']}" for d in spec["devices"]
    }

    # again, in both API versions: the same answer, nothing prepared twice
    assert (await kubelet.prepare([claim]))[claim.uid] == first
    assert (await kubelet.prepare([claim], "v1beta1.DRAPlugin"))[claim.uid] == first
    assert prepared_lines([driver], claim.uid) == 1

    figures = await metrics(driver)
    assert figures['rdmaplane_dra_prepare_results_total{result="prepared"}'] == 1
    assert figures['rdmaplane_dra_prepare_results_total{result="cached"}'] == 3
    assert figures["rdmaplane_dra_prepared_claims"] == 1
    assert figures["rdmaplane_dra_devices"] == len(devices)

    assert await kubelet.unprepare([claim]) == {claim.uid: ""}
    assert not (node.cdi_dir / f"{spec_name(DRIVER, claim.uid)}.json").exists()
    assert await kubelet.unprepare([claim], "v1beta1.DRAPlugin") == {claim.uid: ""}
    assert driver.proc.poll() is None


async def test_bad_claims_fail_alone_and_the_driver_carries_on(
    kube: AsyncClient,
    namespace: str,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
    scheduler: Process,
) -> None:
    driver = start_driver()
    kubelet = await registered(node)
    devices = await published(kube, node)
    vanishing, results = await allocated_claim(kube, namespace, node, nics(1))
    gone = devices[results[0]["device"]]["attributes"]["rdmaDevice"]["string"]
    (node.tree / "class" / "infiniband" / gone).unlink()  # the HCA leaves the node
    await until(lambda: _without(kube, node, results[0]["device"]), f"{gone} gone from the slice")
    good, _ = await allocated_claim(kube, namespace, node, nics(2))
    typo = {"apiVersion": "rdmaplane.io/v1alpha1", "kind": "RdmaDeviceConfig", "ncl": {}}
    malformed, _ = await allocated_claim(kube, namespace, node, nics(1, typo))
    missing = Claim(namespace, "no-such-claim", str(uuid.uuid4()))
    replaced = Claim(namespace, good.name, str(uuid.uuid4()))

    got = await kubelet.prepare([good, vanishing, malformed, missing, replaced])

    assert set(got) == {c.uid for c in (good, vanishing, malformed, missing, replaced)}
    assert got[good.uid].error == "" and len(got[good.uid].devices) == 2
    expected = {
        vanishing.uid: f"claim {namespace}/{vanishing.name}: device {results[0]['device']} "
        "(request nic-0) is not on this node any more",
        malformed.uid: f"claim {namespace}/{malformed.name}: config[0] (FromClaim): ncl: "
        "unknown key (did you mean nccl?)",
        missing.uid: f"claim {namespace}/no-such-claim: not found",
        replaced.uid: f"claim {namespace}/{good.name}: the API server holds UID {good.uid}",
    }
    for uid, message in expected.items():
        assert got[uid].devices == () and got[uid].error.startswith(message), got[uid].error
    assert driver.proc.poll() is None
    again = await kubelet.prepare([good])
    assert again[good.uid] == got[good.uid]


async def test_a_port_down_taints_its_device_until_it_comes_back(
    kube: AsyncClient,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
) -> None:
    set_port = node.set_port

    # The bonded storage port (200G, not the 400G compute class the fault classes judge) is
    # down before the driver starts: its first slice says so.
    set_port("mlx5_bond_0", up=False)
    driver = start_driver()
    devices = await published(kube, node)
    by_hca = {d["attributes"]["rdmaDevice"]["string"]: n for n, d in devices.items()}

    async def taints(hca: str) -> list[dict[str, Any]]:
        return list((await slice_devices(kube, node.name))[by_hca[hca]].get("taints", []))

    def said(found: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
        return {(t["key"], t["value"], t["effect"]) for t in found}

    assert {n: said(d.get("taints", [])) for n, d in devices.items()} == {
        n: {(TAINT_KEY, "PortDown", "NoSchedule")} if n == by_hca["mlx5_bond_0"] else set()
        for n in devices
    }
    assert any(
        "tainted rdmaplane.io/rdma-unhealthy=PortDown:NoSchedule (mlx5_bond_0: no port ACTIVE"
        in str(line.get("msg"))
        for line in driver.lines()
    )

    # A compute port going down: PortDown at once, and the fatal fault (no hysteresis here).
    set_port("mlx5_4", up=False)
    first = await until(lambda: _with(taints("mlx5_4"), 2), "mlx5_4 tainted PortDown and fatal")
    assert said(first) == {
        (TAINT_KEY, "fatal", "NoExecute"),
        (TAINT_KEY, "PortDown", "NoSchedule"),
    }
    set_port("mlx5_5", up=False)  # another change: the pool is published again
    await until(lambda: taints("mlx5_5"), "mlx5_5 tainted")
    assert await taints("mlx5_4") == first  # the same timeAdded: tolerations keep counting
    figures = await metrics(driver)
    assert figures['rdmaplane_dra_tainted_devices{effect="NoSchedule"}'] == 3
    assert figures['rdmaplane_dra_tainted_devices{effect="NoExecute"}'] == 2
    for hca in ("mlx5_4", "mlx5_5", "mlx5_bond_0"):
        set_port(hca, up=True)

    async def clear() -> bool:
        return not any([await taints(h) for h in ("mlx5_4", "mlx5_5", "mlx5_bond_0")])

    await until(clear, "taints removed")
    assert set(await slice_devices(kube, node.name)) == set(devices)  # nothing left the pool


async def test_rising_error_counters_refuse_any_port_until_they_age_out(
    kube: AsyncClient,
    node: DraHost,
    start_driver: Callable[[], DriverProcess],
) -> None:
    """Error counters over the health threshold make a port one that cannot be handed out,
    whatever its link class, as the device plugin reports such an HCA Unhealthy: the bonded
    storage port (which the fault classes never judge) and a compute port alike are tainted
    `ReportedFault:NoSchedule`, the counter named in the log, and untainted once the increments
    have left the health window."""
    driver = start_driver()
    devices = await published(kube, node)
    by_hca = {d["attributes"]["rdmaDevice"]["string"]: n for n, d in devices.items()}
    erring = {by_hca[h]: h for h in ("mlx5_bond_0", "mlx5_4")}

    async def tainted() -> dict[str, set[tuple[str, str, str]]]:
        """The devices with taints, by name, once both erring ones have theirs."""
        said = {
            n: {(t["key"], t["value"], t["effect"]) for t in d.get("taints", [])}
            for n, d in (await slice_devices(kube, node.name)).items()
        }
        return {n: s for n, s in said.items() if s} if all(said[n] for n in erring) else {}

    for hca in erring.values():  # over the window's 10, under the hourly 120 (fatal, an hour)
        counter = node.tree / "class/infiniband" / hca / "ports/1/counters/symbol_error"
        counter.write_text("50\n")
    # Both written together, so refused from the same poll on: one look sees both.
    refused = {(TAINT_KEY, "ReportedFault", "NoSchedule")}
    assert await until(tainted, "both tainted") == {n: refused for n in erring}
    for hca in erring.values():
        line = f"tainted {TAINT_KEY}=ReportedFault:NoSchedule ({hca}: port 1 symbol_error +50"
        assert any(line in str(entry.get("msg")) for entry in driver.lines()), hca

    async def clear() -> bool:
        return not any(d.get("taints") for d in (await slice_devices(kube, node.name)).values())

    await until(clear, f"taints removed once the {HEALTH_WINDOW} window passed")


async def _with(found: Awaitable[list[Any]], count: int) -> list[Any]:
    """`found` once it holds `count` items, else nothing (for `until`)."""
    items = await found
    return items if len(items) == count else []


async def _without(kube: AsyncClient, node: DraHost, device: str) -> bool:
    devices = await slice_devices(kube, node.name)
    return bool(devices) and device not in devices


async def test_a_restart_mid_prepare_prepares_nothing_twice(
    kube: AsyncClient,
    namespace: str,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
    scheduler: Process,
) -> None:
    runs = [start_driver()]
    await registered(node)
    await published(kube, node)
    claims = [(await allocated_claim(kube, namespace, node, nics(1)))[0] for _ in range(6)]
    plugin_dir = node.kubelet_dir / "plugins" / DRIVER

    def states() -> dict[str, str]:
        saved = json.loads((plugin_dir / "checkpoint.json").read_text())["claims"]
        return {c.name: saved[c.uid]["state"] for c in claims if c.uid in saved}

    # 1. The CDI folder cannot be written (a file stands where it should be): the batch is
    # checkpointed as started, no spec gets written, and the driver is killed in that state.
    node.cdi_dir.write_text("not a folder")
    failed = await (await registered(node)).prepare(claims[:3])
    assert all("cannot write its CDI spec" in failed[c.uid].error for c in claims[:3])
    assert set(states().values()) == {"started"}
    runs[-1].kill()
    node.cdi_dir.unlink()

    # 2. Half a batch: one claim's spec cannot be written (a folder holds its name), the others
    # are prepared; killed again.
    blocked = node.cdi_dir / f"{spec_name(DRIVER, claims[4].uid)}.json"
    blocked.mkdir(parents=True)
    runs.append(start_driver())
    half = await (await registered(node)).prepare(claims)
    assert [bool(half[c.uid].error) for c in claims] == [False, False, False, False, True, False]
    assert states() == {c.name: "started" if c == claims[4] else "prepared" for c in claims}
    runs[-1].kill()
    blocked.rmdir()

    # 3. Restarted, asked for the whole batch again, as the kubelet does after a failed call.
    runs.append(start_driver())
    final = await (await registered(node)).prepare(claims)

    for claim in claims:
        assert final[claim.uid].error == "" and len(final[claim.uid].devices) == 1
        assert prepared_lines(runs, claim.uid) == 1, f"{claim.name} prepared twice (or never)"
        CDI.validate(spec_of(node, claim.uid))
    assert [prepared_lines(runs[-1:], c.uid) for c in claims] == [0, 0, 0, 0, 1, 0]
    assert all(final[c.uid] == half[c.uid] for c in claims if c != claims[4])
    assert set(states().values()) == {"prepared"}
    left = [p.name for p in [*node.cdi_dir.iterdir(), *plugin_dir.iterdir()]]
    assert not [n for n in left if n.startswith(".rdmaplane-")], left

    # 4. Killed right after answering: the next driver answers from the checkpoint alone.
    runs[-1].kill()
    runs.append(start_driver())
    assert (await (await registered(node)).prepare(claims)) == final
    assert sum(prepared_lines(runs[-1:], c.uid) for c in claims) == 0
    assert runs[-1].proc.poll() is None


async def test_the_driver_may_write_only_its_own_nodes_slices(
    kube_cluster: KubeCluster, kube: AsyncClient
) -> None:
    """deploy/dra/rbac.yaml's admission policy, for a user of this test's own (the driver's
    name would catch the other tests' driver, which authenticates without a node name)."""
    user = f"system:serviceaccount:e2e:vap-{uuid.uuid4().hex[:6]}"
    objects = list(codecs.load_all_yaml((DRA_DEPLOY / "rbac.yaml").read_text()))
    policy = next(o for o in objects if o.kind == "ValidatingAdmissionPolicy")
    binding = next(o for o in objects if o.kind == "ValidatingAdmissionPolicyBinding")
    suffix = uuid.uuid4().hex[:6]
    policy.metadata.name += f"-{suffix}"
    binding.metadata.name += f"-{suffix}"
    binding.spec.policyName = policy.metadata.name
    condition = policy.spec.matchConditions[0]
    condition.expression = condition.expression.replace(DRIVER_USER, user)
    role_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"vap-{suffix}"},
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": "rdmaplane-dra-driver",
        },
        "subjects": [{"kind": "User", "name": user}],
    }
    with kube_cluster.client() as client:
        for obj in [codecs.from_dict(role_binding), policy, binding]:
            client.create(obj)
    try:

        async def status(slice_node: str, node_claim: str | None) -> int:
            headers = {"Impersonate-User": user}
            if node_claim is not None:
                headers["Impersonate-Extra-authentication.kubernetes.io%2Fnode-name"] = node_claim
            body = {
                "apiVersion": "resource.k8s.io/v1",
                "kind": "ResourceSlice",
                "metadata": {"name": f"vap-{uuid.uuid4().hex[:6]}"},
                "spec": {
                    "driver": DRIVER,
                    "nodeName": slice_node,
                    "pool": {"name": slice_node, "generation": 1, "resourceSliceCount": 1},
                },
            }
            async with httpx.AsyncClient(verify=kube_cluster.tls_context()) as http:
                answer = await http.post(
                    f"{kube_cluster.server}/apis/resource.k8s.io/v1/resourceslices?dryRun=All",
                    json=body,
                    headers=headers,
                )
            return answer.status_code

        async def denied() -> bool:  # the policy takes effect once its informer has it
            return await status("node-b", "node-a") in (403, 422)

        await until(denied, "the policy in effect")
        assert await status("node-a", "node-a") == 201
        assert await status("node-a", None) in (403, 422)
    finally:
        with kube_cluster.client() as client:
            for obj in (binding, policy):
                client.delete(type(obj), obj.metadata.name)
            client.delete(type(codecs.from_dict(role_binding)), f"vap-{suffix}")


# ---------------------------------------------------------------- DRA as of v1.37


def conditions(claim: Mapping[str, Any]) -> dict[str, dict[str, dict[str, Any]]]:
    """The claim's status.devices of this driver: device → condition type → condition."""
    return {
        d["device"]: {c["type"]: c for c in d.get("conditions", [])}
        for d in (claim.get("status") or {}).get("devices") or []
        if d["driver"] == DRIVER
    }


async def test_a_pod_binds_once_the_driver_set_its_nics_ready_on_its_own_nodes_claims_only(
    kube: AsyncClient,
    kube_cluster: KubeCluster,
    namespace: str,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
    scheduler: Process,
) -> None:
    driver = start_driver()
    await published(kube, node)
    pod, name = await claim_pod(kube, namespace, node.group, nics(2))

    assert await bound_node(kube, namespace, pod) == node.name
    figures = await metrics(driver)
    assert figures["rdmaplane_dra_claim_status_writes_total"] >= 1
    stored = (await kube.get(ResourceClaim, name, namespace=namespace)).to_dict()
    said = conditions(stored)
    allocated = {r["device"] for r in stored["status"]["allocation"]["devices"]["results"]}
    assert set(said) == allocated
    for device in said.values():
        assert (device[READY]["status"], device[FAILED]["status"]) == ("True", "False")
        assert " is ACTIVE; GID index 3 holds " in device[READY]["message"]

    # The driver of another node, with the credential its own pod gets, may not touch them:
    # the API server's per-driver check (associated-node:patch) names the node of its token.
    elsewhere = f"dra-elsewhere-{uuid.uuid4().hex[:6]}"
    await add_ready_node(kube, elsewhere, {}, {})
    try:
        async with async_client(driver_kubeconfig_on(kube_cluster, elsewhere)) as other:
            meddling = copy.deepcopy(stored["status"]["devices"])
            for d in meddling:
                for c in d["conditions"]:
                    c["status"] = "False"
            with pytest.raises(ApiError) as refused:
                await other.patch(
                    ResourceClaimStatus, name, {"status": {"devices": meddling}},
                    namespace=namespace, patch_type=PatchType.MERGE,
                )  # fmt: skip
        assert refused.value.status.code in (403, 422)
        assert "resourceclaims/driver" in (refused.value.status.message or "")
    finally:
        nodeaccess.remove_pod(kube_cluster, elsewhere, nodeaccess.DRA_DAEMONSET)
        await kube.delete(Node, elsewhere)


async def next_report(
    stream: AsyncGenerator[list[Health], None],
    wanted: Callable[[dict[str, Health]], bool],
    what: str,
) -> dict[str, Health]:
    """The first health report of the stream (by device) that `wanted` accepts."""
    try:
        async with asyncio.timeout(WAIT_S):
            async for report in stream:
                by_device = {h.device: h for h in report}
                if wanted(by_device):
                    return by_device
    except TimeoutError:
        pass
    raise AssertionError(f"no health report within {WAIT_S:g} s: {what}")


async def test_the_health_stream_tells_the_kubelet_a_port_went_down_and_came_back(
    kube: AsyncClient, node: DraHost, start_driver: Callable[..., DriverProcess]
) -> None:
    driver = start_driver(health_resend="1s")
    kubelet = await registered(node)
    devices = await published(kube, node)
    by_hca = {d["attributes"]["rdmaDevice"]["string"]: n for n, d in devices.items()}
    stream = kubelet.watch_health()

    first = await next_report(stream, lambda r: set(r) == set(devices), "every device")
    assert (await metrics(driver))["rdmaplane_dra_health_streams"] == 1
    assert {(h.pool, h.health) for h in first.values()} == {(node.name, "HEALTHY")}
    assert {h.timeout_s for h in first.values()} == {30}

    node.set_port("mlx5_4", up=False)
    down = by_hca["mlx5_4"]
    seen = await next_report(stream, lambda r: r[down].health == "UNHEALTHY", "mlx5_4 unhealthy")
    assert seen[down].message.startswith("PortDown: mlx5_4: no port ACTIVE and LinkUp")
    assert {h.health for d, h in seen.items() if d != down} == {"HEALTHY"}
    node.set_port("mlx5_4", up=True)
    back = await next_report(stream, lambda r: r[down].health == "HEALTHY", "mlx5_4 healthy")
    assert back[down].message == ""
    # with nothing changing, the whole list comes again within the kubelet's timeout
    again = await next_report(stream, lambda r: set(r) == set(devices), "a resend")
    assert again[down].updated >= back[down].updated
    await stream.aclose()
    await kubelet.close()


async def test_taints_clear_themselves_once_the_port_recovered_with_the_agents_hysteresis(
    kube: AsyncClient,
    namespace: str,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
    scheduler: Process,
) -> None:
    # fatalAfter 1 s, clearAfter 6 s: the NoSchedule taint follows the port at every poll,
    # the fault's NoExecute taint comes after 1 s of symptoms and goes after 6 s without
    start_driver(fault=("1s", "6s"))
    devices = await published(kube, node)
    device = next(
        n for n, d in devices.items() if d["attributes"]["rdmaDevice"]["string"] == "mlx5_4"
    )

    async def taints() -> dict[str, dict[str, Any]]:
        found = (await slice_devices(kube, node.name))[device].get("taints", [])
        return {t["value"]: t for t in found}

    async def holding(*values: str) -> dict[str, dict[str, Any]] | None:
        found = await taints()
        return found if set(found) == set(values) else None

    node.set_port("mlx5_4", up=False)
    both = await until(lambda: holding("PortDown", "fatal"), "PortDown and fatal")
    added = both["fatal"]["timeAdded"]
    only_mlx5_4 = {
        "devices": {"requests": [{"name": "nic", "exactly": {
            "deviceClassName": DRIVER,
            "selectors": [{"cel": {"expression":
                f"device.attributes['{DRIVER}'].rdmaDevice == 'mlx5_4'"}}],
        }}]}
    }  # fmt: skip
    waiting, waiting_claim = await claim_pod(kube, namespace, node.group, only_mlx5_4)

    # up: PortDown goes at the next poll, the fault stays until clearAfter has passed
    node.set_port("mlx5_4", up=True)
    fault_only = await until(lambda: holding("fatal"), "PortDown removed, fatal kept")
    assert fault_only["fatal"]["timeAdded"] == added
    # a flap within clearAfter is the same fault, the same timeAdded (tolerations keep counting)
    node.set_port("mlx5_4", up=False)
    flapped = await until(lambda: holding("PortDown", "fatal"), "PortDown again")
    assert flapped["fatal"]["timeAdded"] == added
    assert await pending(kube, namespace, waiting)
    node.set_port("mlx5_4", up=True)

    async def untainted() -> bool:
        return not await taints()

    await until(untainted, "every taint gone once clearAfter passed")

    # untainted: the claim that waited gets the port
    (result,) = await allocation(kube, namespace, waiting_claim)
    assert result["device"] == device


async def test_shares_of_shared_nics_get_the_environment_of_their_own_nics(
    kube: AsyncClient,
    namespace: str,
    node: DraHost,
    start_driver: Callable[..., DriverProcess],
    scheduler: Process,
) -> None:
    start_driver(pools=SHARED_POOLS)
    kubelet = await registered(node)
    devices = await published(kube, node)
    assert {d["attributes"]["rdmaDevice"]["string"] for d in devices.values()} == {
        "mlx5_0",
        "mlx5_1",
    }
    two, two_results = await allocated_claim(
        kube, namespace, node, shares(None, None, distinct=PCI_BUS_ID)
    )
    one, one_results = await allocated_claim(kube, namespace, node, shares(None))

    got = await kubelet.prepare([two, one])
    for claim, results in ((two, two_results), (one, one_results)):
        answer = got[claim.uid]
        assert answer.error == ""
        assert sorted(answer.shares) == sorted(r["shareID"] for r in results)
        spec = spec_of(node, claim.uid)
        CDI.validate(spec)
        env = dict(e.split("=", 1) for e in spec["containerEdits"]["env"])
        mine = {f"{devices[r['device']]['attributes']['rdmaDevice']['string']}:1" for r in results}
        assert set(env["NCCL_IB_HCA"].removeprefix("=").split(",")) == mine
    assert len(two_results) == 2 and len(one_results) == 1
    await kubelet.close()
