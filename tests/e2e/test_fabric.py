"""The fabric against the real control plane.

- What `rdmaplane fabric export` writes passes a server-side dry run against the gang
  schedulers' own CRDs: Kueue's `Topology` CRD as Kueue v0.17.0 ships it (read from the Go
  module, downloaded through the Go module proxy like the control plane's own modules), and a
  Volcano `HyperNode` CRD written from Volcano's published API (its modules are not served).
- The real kube-scheduler, calling the extender, places an 8-pod Indexed Job under the one leaf
  that holds it, on 16 nodes under 4 leaves where the node-local score alone would spread it.
  No Job controller runs here: the test creates the Job and its 8 pods the way the Job
  controller does (labels, completion index, owner reference), all before the scheduler starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from lightkube import ApiError, AsyncClient, Client, codecs
from lightkube.generic_resource import create_global_resource
from lightkube.resources.apiextensions_v1 import CustomResourceDefinition
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import Node, Pod
from typer.testing import CliRunner

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.cli import app
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from tests.e2e.controlplane import KubeCluster, Process, add_ready_node, poll_until
from tests.e2e.test_scheduler_extender import (  # noqa: F401 (the extender fixture)
    _scheduler_config,
    _seen_by_extender,
    extender,
)
from tests.fabrics import leaf_spine
from tests.layouts import layout
from tests.scheduler_helpers import pod

KUEUE_MODULE = "sigs.k8s.io/kueue@v0.17.0"
KUEUE_CRD = "config/components/crd/bases/kueue.x-k8s.io_topologies.yaml"
VOLCANO_CRD = Path(__file__).parent / "fixtures" / "volcano-hypernodes-crd.yaml"

create_global_resource("kueue.x-k8s.io", "v1beta2", "Topology", "topologies")
create_global_resource("topology.volcano.sh", "v1alpha1", "HyperNode", "hypernodes")


@pytest.fixture(scope="module")
def gang_crds(kube_cluster: KubeCluster) -> None:
    """Kueue's Topology CRD from its Go module, Volcano's HyperNode CRD from our fixture."""
    found = subprocess.run(
        ["go", "mod", "download", "-json", KUEUE_MODULE],
        cwd=kube_cluster.workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert found.returncode == 0, f"go mod download {KUEUE_MODULE}: {found.stderr or found.stdout}"
    kueue = Path(json.loads(found.stdout)["Dir"]) / KUEUE_CRD
    with kube_cluster.client() as client:
        for path in (kueue, VOLCANO_CRD):
            for crd in codecs.load_all_yaml(path.read_text()):
                client.apply(crd, field_manager="rdmaplane-e2e", force=True)
                _wait_established(client, crd.metadata.name)


def _wait_established(client: Client, name: str) -> None:
    def established() -> bool:
        status = client.get(CustomResourceDefinition, name).status
        return any(c.type == "Established" and c.status == "True" for c in status.conditions or [])

    poll_until(established, 60, f"CRD {name} Established")


def _export(tmp_path: Path, *args: str) -> list[dict[str, Any]]:
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump(leaf_spine(4, 16)))
    result = CliRunner().invoke(app, ["fabric", "export", *args, "--fabric-file", str(path)])
    assert result.exit_code == 0, result.output
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _dry_run(kube_cluster: KubeCluster, docs: list[dict[str, Any]]) -> None:
    with kube_cluster.client() as client:
        for doc in docs:
            client.apply(codecs.from_dict(doc), field_manager="rdmaplane-e2e", dry_run=True)


def test_kueue_topology_passes_kueues_crd(
    kube_cluster: KubeCluster, gang_crds: None, tmp_path: Path
) -> None:
    docs = _export(tmp_path, "--kueue")
    _dry_run(kube_cluster, docs)
    # the check can fail: hostname must be the last level (a rule of Kueue's CRD)
    broken = json.loads(json.dumps(docs[0]))
    broken["spec"]["levels"].reverse()
    with pytest.raises(Exception, match=r"kubernetes\.io/hostname"):
        _dry_run(kube_cluster, [broken])


def test_volcano_hypernodes_pass_the_hypernode_crd(
    kube_cluster: KubeCluster, gang_crds: None, tmp_path: Path
) -> None:
    docs = _export(tmp_path, "--volcano")
    assert len(docs) == 7
    _dry_run(kube_cluster, docs)
    broken = json.loads(json.dumps(docs[0]))
    broken["spec"]["members"][0]["type"] = "Rack"
    with pytest.raises(Exception, match="Unsupported value"):
        _dry_run(kube_cluster, [broken])


async def _bound(kube: AsyncClient, namespace: str, names: list[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for _ in range(480):  # up to 120 s: a loaded CI machine
        for name in names:
            if name not in found:
                got = await kube.get(Pod, name, namespace=namespace)
                if got.spec and got.spec.nodeName:
                    found[name] = got.spec.nodeName
        if len(found) == len(names):
            return found
        await asyncio.sleep(0.25)
    raise AssertionError(f"bound within 120 s: {found}")


async def _job_seen_whole(url: str, pod_obj: dict[str, Any], size: int) -> None:
    """Wait (up to 120 s on a loaded machine) until the extender counts `size` pods to place
    for the group of `pod_obj`."""
    body = {"Pod": pod_obj, "Nodes": None, "NodeNames": []}
    job = None
    async with httpx.AsyncClient() as client:
        for _ in range(480):
            reply = await client.post(f"{url}/debug/explain", json=body)
            job = reply.json().get("job") if reply.status_code == 200 else None
            if job and job.get("remaining") == size:
                return
            await asyncio.sleep(0.25)
    raise AssertionError(f"the extender never saw the whole job of {size} pods: {job}")


async def test_an_indexed_job_lands_under_the_one_leaf_that_holds_it(
    kube: AsyncClient,
    namespace: str,
    extender: str,  # noqa: F811 (pytest passes the imported fixture)
    start_scheduler: Callable[..., Process],
) -> None:
    run = uuid.uuid4().hex[:6]
    nodes = [f"fab-{run}-{k:02d}" for k in range(16)]
    try:
        await _place_the_job(kube, namespace, extender, start_scheduler, run, nodes)
    finally:  # free nodes left behind would draw other tests' pods
        for name in nodes:
            with contextlib.suppress(ApiError):
                await kube.delete(Node, name)
            with contextlib.suppress(ApiError):
                await kube.delete(NodeResourceTopology, name)


def _extender_lines(scheduler: Process) -> list[str]:
    """What kube-scheduler logged about the extender (a timeout, an error), for a failure."""
    text = scheduler.log_path.read_text(errors="replace")
    return [line for line in text.splitlines() if "xtender" in line][-10:]


async def _place_the_job(
    kube: AsyncClient,
    namespace: str,
    extender: str,  # noqa: F811
    start_scheduler: Callable[..., Process],
    run: str,
    nodes: list[str],
) -> None:
    leaf = {n: f"leaf-{run}-{k // 4}" for k, n in enumerate(nodes)}
    for k, name in enumerate(nodes):
        labels = fab.tier_labels(
            fab.Location((leaf[name], f"spine-{run}-{k // 8}")), fab.DEFAULT_TIER_LABELS
        )
        await add_ready_node(kube, name, labels, {nrt.GPU: "8", nrt.HCA: "8"})
        await kube.create(NodeResourceTopology(nrt.to_object(layout("hgx", name))))
    # Room for 4-GPU pods (2 per node): leaf 0 → 5, leaf 1 → 8, leaf 2 → 6, leaf 3 → 4. The
    # half-used nodes pack best node-locally, and none of them is under leaf 1.
    busy = {0: 2, 1: 1, 8: 1, 9: 1, 12: 2, 13: 2}
    for k, count in busy.items():
        for i in range(count):
            name = f"other-{k}-{i}"
            body = pod(name, 4, 4, node=nodes[k], ns=namespace)
            del body["status"]
            await kube.create(Pod.from_dict(body))
            await _seen_by_extender(extender, nodes[k], namespace, name)

    job = await kube.create(
        Job.from_dict(
            {
                "metadata": {"name": "train", "namespace": namespace},
                "spec": {
                    "completionMode": "Indexed",
                    "completions": 8,
                    "parallelism": 8,
                    "template": {
                        "spec": {
                            "restartPolicy": "Never",
                            **pod("x", 4, 4)["spec"],
                        }
                    },
                },
            }
        )
    )
    assert job.metadata is not None and job.metadata.uid
    names = [f"train-{i}-{uuid.uuid4().hex[:5]}" for i in range(8)]
    for i, name in enumerate(names):  # as the Job controller makes them
        body = pod(name, 4, 4, ns=namespace)
        del body["status"]
        body["metadata"]["labels"] = {
            "batch.kubernetes.io/job-name": "train",
            "job-name": "train",
            "batch.kubernetes.io/controller-uid": job.metadata.uid,
            "batch.kubernetes.io/job-completion-index": str(i),
        }
        body["metadata"]["annotations"] = {"batch.kubernetes.io/job-completion-index": str(i)}
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "name": "train",
                "uid": job.metadata.uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        body["spec"]["restartPolicy"] = "Never"
        created = await kube.create(Pod.from_dict(body))
    # The job's size is what the extender has seen of it: start scheduling once it has seen all
    # eight, as it would by the time a Job controller's burst of creations reaches its watch.
    await _job_seen_whole(extender, created.to_dict(), 8)
    scheduler = start_scheduler(_scheduler_config(extender))
    placed = await _bound(kube, namespace, names)
    leaves = {leaf[n] for n in placed.values()}
    threads = sorted(t.name for t in threading.enumerate())  # the extender runs in one of them
    assert leaves == {f"leaf-{run}-1"}, (placed, _extender_lines(scheduler), threads)
    assert len(set(placed.values())) == 4  # two 4-GPU pods on each of its nodes
