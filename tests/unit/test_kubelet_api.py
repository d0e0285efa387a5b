"""The kubelet APIs: wire names and field numbers as upstream, stubs in step with the .proto."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rdmaplane.adapters.kubelet.api.deviceplugin.v1beta1 import api_pb2 as dp
from rdmaplane.adapters.kubelet.api.dra.v1 import api_pb2 as dra
from rdmaplane.adapters.kubelet.api.dra.v1beta1 import api_pb2 as dra_beta
from rdmaplane.adapters.kubelet.api.pluginregistration.v1 import api_pb2 as reg
from rdmaplane.adapters.kubelet.api.podresources.v1 import api_pb2 as pr

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("module", "service", "methods"),
    [
        (dp, "v1beta1.Registration", ["Register"]),
        (
            dp,
            "v1beta1.DevicePlugin",
            [
                "GetDevicePluginOptions",
                "ListAndWatch",
                "GetPreferredAllocation",
                "Allocate",
                "PreStartContainer",
            ],
        ),
        (reg, "pluginregistration.Registration", ["GetInfo", "NotifyRegistrationStatus"]),
        (pr, "v1.PodResourcesLister", ["List", "GetAllocatableResources", "Get"]),
        (
            dra,
            "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
            ["NodePrepareResources", "NodeUnprepareResources"],
        ),
        (
            dra_beta,
            "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
            ["NodePrepareResources", "NodeUnprepareResources"],
        ),
    ],
)
def test_method_paths_are_upstreams(module: object, service: str, methods: list[str]) -> None:
    """gRPC routes by `/<package>.<Service>/<Method>`: these must be upstream's exactly."""
    found = module.DESCRIPTOR.services_by_name[service.rsplit(".", 1)[1]]  # type: ignore[attr-defined]
    assert found.full_name == service
    assert [m.name for m in found.methods] == methods


@pytest.mark.parametrize(
    ("message", "fields"),
    [
        (dp.RegisterRequest, {"version": 1, "endpoint": 2, "resource_name": 3, "options": 4}),
        (dp.Device, {"ID": 1, "health": 2, "topology": 3}),
        (
            dp.ContainerPreferredAllocationRequest,
            {"available_deviceIDs": 1, "must_include_deviceIDs": 2, "allocation_size": 3},
        ),
        (
            dp.ContainerAllocateResponse,
            {"envs": 1, "mounts": 2, "devices": 3, "annotations": 4, "cdi_devices": 5},
        ),
        (dp.DeviceSpec, {"container_path": 1, "host_path": 2, "permissions": 3}),
        (reg.PluginInfo, {"type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}),
        (
            pr.ContainerResources,
            {"name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5},
        ),
        (pr.DynamicResource, {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}),
        (dra.Claim, {"namespace": 1, "uid": 2, "name": 3}),
        (dra.NodePrepareResourceResponse, {"devices": 1, "error": 2}),
        (
            dra.Device,
            {
                "request_names": 1,
                "pool_name": 2,
                "device_name": 3,
                "cdi_device_ids": 4,
                "share_id": 5,
            },
        ),
        (
            dra_beta.Device,
            {"request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4},
        ),
        (dra.NodeUnprepareResourceResponse, {"error": 1}),
    ],
)
def test_field_numbers_are_upstreams(message: type, fields: dict[str, int]) -> None:
    got = {f.name: f.number for f in message.DESCRIPTOR.fields}  # type: ignore[attr-defined]
    assert got == fields


def test_committed_stubs_match_the_protos(tmp_path: Path) -> None:
    """Whoever edits or adds a .proto reruns scripts/gen-protos.sh; this notices if not."""
    out = tmp_path / "api"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable}
    subprocess.run(
        ["bash", str(REPO / "scripts" / "gen-protos.sh")],
        cwd=REPO,
        env=env,
        check=True,
        capture_output=True,
    )
    committed = REPO / "src" / "rdmaplane" / "adapters" / "kubelet" / "api"
    generated = sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())
    assert generated == sorted(
        p.relative_to(committed)
        for p in committed.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )
    differ = [str(p) for p in generated if not filecmp.cmp(out / p, committed / p, shallow=False)]
    assert not differ, f"stale stubs, rerun scripts/gen-protos.sh: {differ}"
