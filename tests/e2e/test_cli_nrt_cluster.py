"""`rdmaplane nrt` and `explain-placement --kubeconfig` against a real kube-apiserver: the
CRD's schema is the judge of the object, the server's RBAC the judge of a refusal."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from pathlib import Path

import yaml
from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Node
from typer.testing import CliRunner

from rdmaplane.adapters.kube import NodeResourceTopology
from rdmaplane.cli import app
from rdmaplane.core import nrt
from tests.e2e.controlplane import KubeCluster, add_ready_node
from tests.scheduler_helpers import pod


async def test_the_nrt_command_writes_what_the_cluster_takes_and_the_extender_reads(
    kube: AsyncClient,
    kube_cluster: KubeCluster,
    nrt_crd: type[NodeResourceTopology],
    tmp_path: Path,
) -> None:
    name = f"nrt-cli-{uuid.uuid4().hex[:6]}"
    policy = ["--topology-manager-policy", "single-numa-node"]
    made = CliRunner().invoke(
        app, ["nrt", "--sample", "hgx-h100-roce", "--node-name", name, "-o", "json", *policy]
    )
    assert made.exit_code == 0, made.output
    await kube.create(nrt_crd(json.loads(made.stdout)))  # the CRD's schema validates it
    try:
        await add_ready_node(kube, name, {}, {nrt.GPU: "8", nrt.HCA: "9"})
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump(pod("job", 4, 4)))
        args = ["explain-placement", str(job), "--kubeconfig", str(kube_cluster.kubeconfig)]
        result = await asyncio.to_thread(CliRunner().invoke, app, [*args, "-o", "json"])
    finally:  # a free node left behind would draw the pods of the tests after this one
        with contextlib.suppress(ApiError):
            await kube.delete(Node, name)
        await kube.delete(nrt_crd, name)
    assert result.exit_code == 0, result.output
    row = next(r for r in json.loads(result.stdout)["nodes"] if r["node"] == name)
    assert row["fits"] and row["alignment"] == "pcie" and row["policy"].startswith("single")


async def test_a_refusal_by_the_api_server_is_one_line(
    kube_cluster: KubeCluster, nrt_crd: type[NodeResourceTopology], tmp_path: Path
) -> None:
    nobody = kube_cluster.kubeconfig_for("rdmaplane-test:nobody")  # no RBAC binding at all
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(pod("job", 1, 1)))
    args = ["explain-placement", str(job), "--kubeconfig", str(nobody)]
    result = await asyncio.to_thread(CliRunner().invoke, app, args)
    assert result.exit_code == 1 and result.stdout == ""
    assert result.stderr.startswith("error: the API server refused: ")
    assert "forbidden" in result.stderr and result.stderr.count("\n") == 1
