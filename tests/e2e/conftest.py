"""End-to-end fixtures: a real control plane (etcd, kube-apiserver, kube-scheduler) on loopback.

Every test under tests/e2e is marked `e2e` automatically; `pytest -m "not e2e"` leaves them out.
The binaries come from `scripts/build-k8s.sh`: the folder in `RDMAPLANE_K8S_BIN` (set by
`make test`), else the script's cache folder. A missing binary fails the tests, it never skips them.

Fixtures
- `kube_cluster` (session): a `KubeCluster` (see `controlplane.py`):
    `.server` API server URL, `.kubeconfig` admin kubeconfig path (user in `system:masters`),
    `.client()` / `.async_client()` lightkube clients (context managers),
    `.kubeconfig_for(user, groups)` kubeconfig for another user (client cert), to test RBAC,
    `.create_namespace(name)` a namespace with its `default` ServiceAccount,
    `.tls_context()` SSL context trusting the cluster CA with the admin cert, for raw HTTPS.
  The API server runs `--authorization-mode=Node,RBAC` with the default admission plugins. There
  is no kube-controller-manager, so nothing creates `default` ServiceAccounts: the fixture creates
  the one in `default`, and `create_namespace`/`namespace` create theirs.
- `kube` (function, async): an `AsyncClient` for the admin, closed after the test.
- `namespace` (function): a fresh namespace; its pods are force-deleted after the test (no kubelet
  would ever confirm a graceful delete).
- `nrt_crd` (session): installs `deploy/crds/noderesourcetopology.yaml`, waits until it is
  Established, returns the lightkube resource class `NodeResourceTopology`.
- `start_scheduler` (function): `start_scheduler(config=None) -> Process` starts kube-scheduler
  (as `system:kube-scheduler`) with a `KubeSchedulerConfiguration` given as a dict or YAML text,
  passed through as is (e.g. with an `extenders:` entry); only apiVersion/kind,
  `clientConnection.kubeconfig` and `leaderElection.leaderElect: false` are filled in when
  missing. Returns once /readyz is 200; stopped after the test.
- `kwok_cluster` (session): a `KwokCluster`, a control plane of its own (etcd,
  kube-apiserver, the NRT CRD) with kube-controller-manager (Job and taint-eviction
  controllers) and KWOK managing nodes annotated `kwok.x-k8s.io/node=fake` with the stages in
  `kwok-stages.yaml` (make such nodes with `add_kwok_node`). Its own, because a Job controller
  would act on every other test's Jobs, and their schedulers would place its pods. The kwok
  binary comes from `RDMAPLANE_KWOK_BIN` or `scripts/build-k8s.sh --kwok-bin-dir`.
Startup failures raise `StartError` naming the binary, its flags and its log tail.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient, Client, codecs
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.core_v1 import Node, Pod

from rdmaplane.adapters.kube import NodeResourceTopology
from tests.e2e.controlplane import (
    BUILD_SCRIPT,
    KubeCluster,
    Process,
    SchedulerConfig,
    StartError,
    build_dir,
    control_plane,
    launch_controller_manager,
    launch_kwok,
    launch_scheduler,
    missing_binaries,
    poll_until,
)

REPO = Path(__file__).resolve().parents[2]
E2E_DIR = Path(__file__).resolve().parent
NRT_CRD = REPO / "deploy" / "crds" / "noderesourcetopology.yaml"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if E2E_DIR in item.path.parents:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def k8s_bin_dir() -> Path:
    configured = os.environ.get("RDMAPLANE_K8S_BIN")
    bin_dir = Path(configured) if configured else build_dir("--bin-dir")
    missing = missing_binaries(bin_dir)
    if missing:
        pytest.fail(
            f"e2e binaries {', '.join(missing)} missing in {bin_dir}: run `make k8s-bins` "
            f"(or {BUILD_SCRIPT.relative_to(REPO)}), or leave e2e out with -m 'not e2e'",
            pytrace=False,
        )
    return bin_dir


@pytest.fixture(scope="session")
def kwok_bin() -> Path:
    configured = os.environ.get("RDMAPLANE_KWOK_BIN")
    binary = Path(configured) if configured else build_dir("--kwok-bin-dir") / "kwok"
    if not binary.is_file():
        pytest.fail(
            f"kwok missing at {binary}: run `make k8s-bins` (or {BUILD_SCRIPT.relative_to(REPO)})",
            pytrace=False,
        )
    return binary


@dataclass(frozen=True)
class KwokCluster:
    """A control plane with the controllers that restart jobs, and KWOK for its nodes."""

    cluster: KubeCluster
    controller_manager: Process
    kwok: Process


@pytest.fixture(scope="session")
def kwok_cluster(k8s_bin_dir: Path, kwok_bin: Path) -> Iterator[KwokCluster]:
    try:
        with contextlib.ExitStack() as stack:
            cluster = stack.enter_context(control_plane(k8s_bin_dir))
            install_nrt_crd(cluster)
            kcm = launch_controller_manager(cluster)
            stack.callback(kcm.stop)
            kwok = launch_kwok(cluster, kwok_bin)
            stack.callback(kwok.stop)
            yield KwokCluster(cluster, kcm, kwok)
            return
    except StartError as err:
        failure = str(err)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def kube_cluster(k8s_bin_dir: Path) -> Iterator[KubeCluster]:
    try:
        with control_plane(k8s_bin_dir) as cluster:
            yield cluster
            return
    except StartError as err:
        failure = str(err)
    pytest.fail(failure, pytrace=False)  # outside `except`: the message once, no traceback


@pytest.fixture
async def kube(kube_cluster: KubeCluster) -> AsyncIterator[AsyncClient]:
    async with kube_cluster.async_client() as client:
        yield client


@pytest.fixture
def namespace(kube_cluster: KubeCluster) -> Iterator[str]:
    name = f"e2e-{uuid.uuid4().hex[:8]}"
    kube_cluster.create_namespace(name)
    yield name
    with kube_cluster.client() as client:
        client.deletecollection(Pod, namespace=name, grace_period=0)


@pytest.fixture(autouse=True)
def nothing_left_behind(request: pytest.FixtureRequest) -> Iterator[None]:
    """Nodes (with their NRTs) and pods a test made in the shared session cluster are deleted
    after it: a free node left behind draws the next test's pods, and a pod left Pending (no
    scheduler ran in its test) is bound by the next test's kube-scheduler onto that test's
    nodes, taking their room (both seen as placement tests failing only after others ran)."""
    if "kube_cluster" not in request.fixturenames:
        yield
        return
    cluster: KubeCluster = request.getfixturevalue("kube_cluster")
    with cluster.client() as client:
        nodes_before = _names(client.list(Node))
        pods_before = _names(client.list(Pod, namespace="*"))
    yield
    with cluster.client() as client:
        for namespace, name in _names(client.list(Pod, namespace="*")) - pods_before:
            with contextlib.suppress(ApiError):
                client.delete(Pod, name, namespace=namespace, grace_period=0)
        for _, name in _names(client.list(Node)) - nodes_before:
            with contextlib.suppress(ApiError):
                client.delete(Node, name, grace_period=0)
            with contextlib.suppress(ApiError):
                client.delete(NodeResourceTopology, name)


def _names(objects: Iterable[Any]) -> set[tuple[str, str]]:
    return {(o.metadata.namespace or "", o.metadata.name) for o in objects if o.metadata}


@pytest.fixture(scope="session")
def nrt_crd(kube_cluster: KubeCluster) -> type[NodeResourceTopology]:
    install_nrt_crd(kube_cluster)
    return NodeResourceTopology


def install_nrt_crd(cluster: KubeCluster) -> None:
    with cluster.client() as client:
        for crd in codecs.load_all_yaml(NRT_CRD.read_text()):
            client.apply(crd, force=True)
            _wait_established(client, crd.metadata.name)


def _wait_established(client: Client, name: str) -> None:
    def established() -> bool:
        status = client.get(CustomResourceDefinition, name).status
        conditions = (status.conditions if status else None) or []
        return any(c.type == "Established" and c.status == "True" for c in conditions)

    poll_until(established, 30, f"CRD {name} Established")


@pytest.fixture
def start_scheduler(kube_cluster: KubeCluster) -> Iterator[Callable[..., Process]]:
    started: list[Process] = []

    def start(config: SchedulerConfig | None = None) -> Process:
        process = launch_scheduler(kube_cluster, config)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
