"""The real node tier: a real kubelet v1.37.2 and containerd v2 with runc on this machine.

Every test under tests/node is marked `node` (`make test-fast` leaves them out). They need root,
runc and busybox-static (`make node-deps`), and the node's binaries from `scripts/build-k8s.sh
node` (the folder in `RDMAPLANE_NODE_BIN`, set by `make test`, else the script's cache folder);
a missing piece fails the tests, it never skips them.

Fixtures (session-wide: one control plane and one node for the tier)
- `node_cluster`: a `NodeCluster`: the control plane of tests/e2e (kube-apiserver told to reach
  kubelets at their InternalIP with a client certificate), kube-controller-manager (the Job,
  DaemonSet, garbage-collector and root-CA publisher controllers) and kube-scheduler.
- `node_sample`: the sysfs tree of the `hgx-h100-roce` sample the node's RDMA plugins read (a
  test that changes a port puts it back), with a device node for each of its HCAs in the node's
  `/dev/infiniband`.
- `rdmaplane_image`: `make image`'s archive of rdmaplane's own image (`RDMAPLANE_IMAGE`, set
  by `make test`, else dist/, which must be newer than its sources), imported as `IMAGE`.
- `node_images`: the image tars: busybox (also the pause image) and Python (`images.py`), and
  rdmaplane's own.
- `real_node`: the `RealNode` (`realnode.py`), Ready and schedulable; at the end it is stopped
  and the host is compared with how it was before: any change fails the session.
- `node_namespace` (function): a fresh namespace; its pods are deleted after the test, and the
  test waits until the kubelet has stopped them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import tempfile
import time
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from lightkube import AsyncClient
from lightkube.resources.core_v1 import Pod

from rdmaplane import __version__
from rdmaplane.adapters.discovery import samples
from tests.e2e.conftest import install_nrt_crd as install_nrt_crd
from tests.e2e.conftest import k8s_bin_dir  # noqa: F401  (fixture)
from tests.e2e.controlplane import (
    BUILD_SCRIPT,
    KubeCluster,
    Pki,
    Process,
    StartError,
    build_dir,
    control_plane,
    launch_controller_manager,
    launch_scheduler,
)
from tests.node import hoststate, images, realnode
from tests.node.realnode import (
    BUSYBOX,
    NODE_BINARIES,
    PYTHON,
    NodeError,
    RealNode,
    make_device_nodes,
    running_node,
)

NODE_DIR = Path(__file__).resolve().parent
REPO = NODE_DIR.parents[1]
SAMPLE = "hgx-h100-roce"
# Jobs (the doctor, the fault chain), DaemonSets (the agent as deployed), the garbage collector
# (their pods go with them) and the root CA in every namespace (kube-root-ca.crt, which a pod's
# ServiceAccount token volume needs)
NODE_CONTROLLERS = ("job", "daemonset", "garbagecollector", "root-ca-cert-publisher")
NODE_PACKAGES = ("runc", "busybox-static", *images.VERBS_PACKAGES)  # as `make node-deps`


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if NODE_DIR in item.path.parents:
            item.add_marker(pytest.mark.node)


@pytest.fixture(scope="session")
def node_bin_dir() -> Path:
    configured = os.environ.get("RDMAPLANE_NODE_BIN")
    bin_dir = Path(configured) if configured else build_dir("node", "--bin-dir")
    missing = [b for b in NODE_BINARIES if not (bin_dir / b).is_file()]
    if missing:
        pytest.fail(
            f"node binaries {', '.join(missing)} missing in {bin_dir}: run `make k8s-bins` "
            f"(or {BUILD_SCRIPT.relative_to(REPO)} node), or leave the tier out with -m 'not node'",
            pytrace=False,
        )
    installed = subprocess.run(["dpkg", "-s", *NODE_PACKAGES], capture_output=True).returncode == 0
    if not installed or os.geteuid() != 0:
        pytest.fail(
            f"the node tier runs as root with Debian's {', '.join(NODE_PACKAGES)}: run"
            " `make node-deps` (as root), or leave the tier out with -m 'not node'",
            pytrace=False,
        )
    return bin_dir


@dataclass(frozen=True)
class NodeCluster:
    cluster: KubeCluster
    controller_manager: Process
    scheduler: Process
    kubelet_client_ca: Path  # the CA of the API server's client certificate for kubelets


@pytest.fixture(scope="session")
def node_cluster(k8s_bin_dir: Path) -> Iterator[NodeCluster]:  # noqa: F811
    with tempfile.TemporaryDirectory(prefix="rdmaplane-node-pki-") as pki_dir:
        pki = Pki(Path(pki_dir))
        cert, key = pki.issue("kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"])
        args = [
            "--kubelet-preferred-address-types=InternalIP",
            f"--kubelet-client-certificate={cert}",
            f"--kubelet-client-key={key}",
        ]
        try:
            with contextlib.ExitStack() as stack:
                cluster = stack.enter_context(control_plane(k8s_bin_dir, lambda _: args))
                kcm = launch_controller_manager(cluster, NODE_CONTROLLERS)
                stack.callback(kcm.stop)
                scheduler = launch_scheduler(cluster)
                stack.callback(scheduler.stop)
                yield NodeCluster(cluster, kcm, scheduler, pki.ca_cert)
                return
        except StartError as err:
            failure = str(err)
    pytest.fail(failure, pytrace=False)


@pytest.fixture(scope="session")
def node_workdir() -> Iterator[Path]:
    """The tier node's folder (`realnode.node_workdir`); `RDMAPLANE_NODE_KEEP=1` keeps it until
    the next run of the tier."""
    try:
        with realnode.node_workdir(keep=bool(os.environ.get("RDMAPLANE_NODE_KEEP"))) as path:
            yield path
    except NodeError as err:
        pytest.fail(str(err), pytrace=False)


@pytest.fixture(scope="session")
def node_sample(node_workdir: Path) -> Path:
    tree = node_workdir / "sys"
    samples.build(samples.load(SAMPLE).spec, tree)
    make_device_nodes(tree, node_workdir / "node" / "dev")
    return tree


@pytest.fixture(scope="session")
def rdmaplane_image() -> Path:
    configured = os.environ.get("RDMAPLANE_IMAGE")
    archive = Path(configured) if configured else REPO / "dist" / f"rdmaplane-{__version__}.oci.tar"
    if not archive.is_file():
        pytest.fail(f"{archive} missing: run `make image`", pytrace=False)
    up_to_date = ["make", "-q", "--no-print-directory", "-C", str(REPO), "image"]
    if not configured and subprocess.run(up_to_date).returncode:
        pytest.fail(f"{archive} is older than its sources: run `make image`", pytrace=False)
    return archive


@pytest.fixture(scope="session")
def node_images(tmp_path_factory: pytest.TempPathFactory, rdmaplane_image: Path) -> list[Path]:
    out = tmp_path_factory.mktemp("images")
    torch = images.HOST_SITE / "torch"
    return [
        images.busybox_image(BUSYBOX, out / "busybox.tar").tar,
        images.python_image(PYTHON, out / "python.tar", [torch] if torch.is_dir() else []).tar,
        rdmaplane_image,
    ]


@pytest.fixture(scope="session")
def real_node(
    node_bin_dir: Path,
    node_cluster: NodeCluster,
    node_workdir: Path,
    node_sample: Path,
    node_images: list[Path],
) -> Iterator[RealNode]:
    node = RealNode(
        node_bin_dir,
        node_cluster.cluster,
        node_workdir / "node",
        node_images,
        client_ca=node_cluster.kubelet_client_ca,
    )
    if node.remove_stale_bridge():
        warnings.warn(f"removed {node.bridge}, left on the host by an earlier run", stacklevel=1)
    before = hoststate.snapshot()
    failure = None
    try:
        with running_node(node):
            yield node
    except (NodeError, StartError) as err:  # at its start or its end
        failure = str(err)
    if failure:
        pytest.fail(failure, pytrace=False)
    changes = before.changes(hoststate.snapshot())
    assert not changes, "the node changed the host:\n" + "\n".join(changes)


@pytest.fixture(scope="session")
def node_nrt_crd(node_cluster: NodeCluster) -> None:
    """The NodeResourceTopology CRD, which the agent publishes to."""
    install_nrt_crd(node_cluster.cluster)


@pytest.fixture
async def kube(node_cluster: NodeCluster) -> AsyncIterator[AsyncClient]:
    async with node_cluster.cluster.async_client() as client:
        yield client


@pytest.fixture
async def node_namespace(
    node_cluster: NodeCluster, kube: AsyncClient, real_node: RealNode
) -> AsyncIterator[str]:
    name = f"node-{uuid.uuid4().hex[:8]}"
    node_cluster.cluster.create_namespace(name)
    yield name
    await kube.deletecollection(Pod, namespace=name, grace_period=1)
    deadline = time.monotonic() + 60
    while [p async for p in kube.list(Pod, namespace=name)]:
        if time.monotonic() > deadline:
            raise NodeError(f"pods of {name} still there after 60 s")
        await asyncio.sleep(0.2)
