"""Our NodeResourceTopology CRD, installed in a real kube-apiserver: objects round-trip and the
schema rejects what upstream NRT consumers could not read."""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from lightkube import ApiError, AsyncClient

from rdmaplane.adapters.kube import NodeResourceTopology


def nrt_body(name: str) -> dict[str, Any]:
    """Two NUMA zones, the first with a PCIe switch zone below it, as the agent publishes them."""

    def resources(gpus: int, hcas: str) -> list[dict[str, Any]]:
        return [
            {"name": "nvidia.com/gpu", "capacity": gpus, "allocatable": gpus, "available": 2},
            {"name": "rdmaplane.io/hca", "capacity": hcas, "allocatable": hcas, "available": "1"},
        ]

    return {
        "metadata": {"name": name},
        "attributes": [
            {"name": "topologyManagerPolicy", "value": "single-numa-node"},
            {"name": "topologyManagerScope", "value": "pod"},
        ],
        "zones": [
            {
                "name": "node-0",
                "type": "Node",
                "costs": [{"name": "node-0", "value": 10}, {"name": "node-1", "value": 21}],
                "resources": [
                    *resources(4, "4"),
                    {
                        "name": "memory",
                        "capacity": "512Gi",
                        "allocatable": "500Gi",
                        "available": "500Gi",
                    },
                ],
            },
            {
                "name": "node-1",
                "type": "Node",
                "costs": [{"name": "node-0", "value": 21}, {"name": "node-1", "value": 10}],
                "resources": resources(4, "4"),
            },
            {
                "name": "pci0000:17",
                "type": "PCIeRoot",
                "parent": "node-0",
                "attributes": [{"name": "gpus", "value": "GPU0"}],
                "resources": resources(1, "1"),
            },
        ],
    }


def unique_name() -> str:
    return f"gpu-node-{uuid.uuid4().hex[:8]}"


async def test_nrt_round_trips_through_the_api_server(
    kube: AsyncClient, nrt_crd: type[NodeResourceTopology]
) -> None:
    name = unique_name()
    sent = nrt_body(name)

    await kube.create(nrt_crd(copy.deepcopy(sent)))
    stored = await kube.get(nrt_crd, name)

    assert stored.apiVersion == "topology.node.k8s.io/v1alpha2"
    assert stored.kind == "NodeResourceTopology"
    assert stored.metadata is not None and stored.metadata.uid
    assert stored["attributes"] == sent["attributes"]
    assert stored["zones"] == sent["zones"]
    listed = [o.metadata.name async for o in kube.list(nrt_crd) if o.metadata]
    assert name in listed


def drop_zone_type(body: dict[str, Any]) -> None:
    del body["zones"][0]["type"]


def drop_zones(body: dict[str, Any]) -> None:
    del body["zones"]


def bad_quantity(body: dict[str, Any]) -> None:
    body["zones"][1]["resources"][0]["capacity"] = "lots"


def drop_available(body: dict[str, Any]) -> None:
    del body["zones"][0]["resources"][1]["available"]


def string_cost(body: dict[str, Any]) -> None:
    body["zones"][0]["costs"][1]["value"] = "far"


def attribute_without_value(body: dict[str, Any]) -> None:
    del body["attributes"][0]["value"]


@pytest.mark.parametrize(
    ("break_it", "field"),
    [
        (drop_zones, "zones"),
        (drop_zone_type, "zones[0].type"),
        (bad_quantity, "zones[1].resources[0].capacity"),
        (drop_available, "zones[0].resources[1].available"),
        (string_cost, "zones[0].costs[1].value"),
        (attribute_without_value, "attributes[0].value"),
    ],
)
async def test_schema_rejects_an_invalid_nrt_naming_the_field(
    kube: AsyncClient,
    nrt_crd: type[NodeResourceTopology],
    break_it: Callable[[dict[str, Any]], None],
    field: str,
) -> None:
    name = unique_name()
    body = nrt_body(name)
    break_it(body)

    with pytest.raises(ApiError) as rejected:
        await kube.create(nrt_crd(body))

    assert rejected.value.status.code == 422
    assert f"{field}:" in (rejected.value.status.message or "")
    with pytest.raises(ApiError, match="not found"):
        await kube.get(nrt_crd, name)
