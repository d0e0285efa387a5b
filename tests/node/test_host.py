"""A whole node's life leaves the host as it was: sysctls, mounts, firewall, links, cgroups and
state folders read before, while a pod runs, and after (`hoststate.py`).

A node of its own (name, bridge and pod subnet apart from the tier's node), so that its start
and its end both fall inside the test.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

from lightkube import ApiError
from lightkube.resources.core_v1 import Node, Pod

from tests.node import hoststate
from tests.node.conftest import NodeCluster
from tests.node.pods import WAIT_S, phase, pod_body
from tests.node.realnode import RealNode, node_workdir, running_node

NAME = "rdmaplane-node-host"


def test_a_node_and_its_pod_leave_the_host_as_it_was(
    node_bin_dir: Path, node_cluster: NodeCluster, node_images: list[Path]
) -> None:
    cluster = node_cluster.cluster
    with node_workdir() as workdir:
        node = RealNode(
            node_bin_dir,
            cluster,
            workdir,
            node_images,
            client_ca=node_cluster.kubelet_client_ca,
            name=NAME,
            index=1,
        )
        node.remove_stale_bridge()
        before = hoststate.snapshot()
        try:
            with running_node(node), cluster.client() as client:
                # a pod with its own network on the node's bridge: veth, CNI, cgroups all in use
                body = pod_body("host-check", ["sh", "-c", "ip -4 addr show eth0"], node=NAME)
                client.create(
                    Pod.from_dict(
                        {**body, "metadata": {"name": "host-check", "namespace": "default"}}
                    )
                )
                deadline = time.monotonic() + WAIT_S
                while phase(pod := client.get(Pod, "host-check", namespace="default")) not in (
                    "Succeeded", "Failed"
                ) and time.monotonic() < deadline:  # fmt: skip
                    time.sleep(0.1)
                assert phase(pod) == "Succeeded", pod.status
                shown = "".join(client.log("host-check", namespace="default", container="c"))
                assert "inet 10.222.1." in shown, shown
                during = hoststate.snapshot()
                client.delete(Pod, "host-check", namespace="default", grace_period=1)
        finally:
            with cluster.client() as client:
                for kind, name, ns in ((Pod, "host-check", "default"), (Node, NAME, None)):
                    with contextlib.suppress(ApiError):
                        client.delete(kind, name, namespace=ns, grace_period=0)  # type: ignore[arg-type]
    after = hoststate.snapshot()
    # while the node ran, only its bridge and the pod's veth were new on the host
    assert during.sysctls == before.sysctls
    assert during.mounts == before.mounts
    assert during.firewall == before.firewall
    assert during.state_paths == before.state_paths
    assert node.bridge in during.links - before.links
    assert before.changes(after) == []
