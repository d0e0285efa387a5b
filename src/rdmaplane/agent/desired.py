"""What the agent wants the API server to say about its node: pure functions of the node state.

The publisher compares these with what it last wrote and writes only the difference, so every
function here must be deterministic (same input → same output, byte for byte).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rdmaplane import nrt
from rdmaplane.agent.health import ERRORS_RISING, PORT_DOWN, HcaHealth
from rdmaplane.model import Hca, NodeTopology

ANNOTATION_TOPOLOGY = "rdmaplane.io/topology"
CONDITION_TYPE = nrt.CONDITION_RDMA_READY
# Every node label the agent owns: one that no longer applies is removed, not left behind.
LABELS = (nrt.LABEL_RDMA, nrt.LABEL_LINK_LAYER, nrt.LABEL_RATE_GBPS, nrt.LABEL_GID_INDEX)


@dataclass(frozen=True, slots=True)
class Condition:
    status: bool
    reason: str
    message: str


def owned_labels(labels: Mapping[str, str], also: Iterable[str] = ()) -> dict[str, str | None]:
    """`nrt.node_labels` (plus fabric tier labels) as a merge patch: the labels the agent owns
    (`LABELS` and the keys in `also`) but does not set now are None, which deletes them."""
    return {name: labels.get(name) for name in (*LABELS, *also)}


def rdma_ready(managed: Iterable[str], health: Mapping[str, HcaHealth]) -> Condition:
    """`RDMAReady`: True when every HCA the node offers to pods is healthy."""
    names = sorted(set(managed))
    if not names:
        return Condition(False, "NoRdmaDevices", "no RDMA devices found on this node")
    sick = [health[n] for n in names if n in health and not health[n].healthy]
    missing = [n for n in names if n not in health]
    if not sick and not missing:
        return Condition(True, "AllDevicesHealthy", f"{len(names)} healthy: {', '.join(names)}")
    parts = [f"{h.hca}: {'; '.join(map(str, h.problems))}" for h in sick]
    parts += [f"{n}: not present" for n in missing]
    kinds = {p.kind for h in sick for p in h.problems}
    reason = next((k for k in (PORT_DOWN, ERRORS_RISING) if k in kinds), "DeviceMissing")
    message = f"{len(sick) + len(missing)} of {len(names)} unhealthy: " + " | ".join(parts)
    return Condition(False, reason, message)


def topology_annotation(
    topo: NodeTopology, health: Mapping[str, HcaHealth], gpu_ids: Mapping[int, str]
) -> str:
    """Compact JSON: per GPU and HCA the NUMA node and PCIe root, per HCA link layer, rate and
    health — what a scheduler needs to pair GPUs with NICs without reading the NRT."""
    doc: dict[str, Any] = {
        "v": 1,
        "gpus": [
            {
                "id": gpu_ids.get(g.index, g.pci.address),
                "index": g.index,
                "numa": _numa(g.pci.numa),
                "pcieRoot": g.pci.root,
            }
            for g in topo.gpus
        ],
        "hcas": [_hca(h, health.get(h.name)) for h in topo.hcas],
    }
    return json.dumps(doc, separators=(",", ":"), sort_keys=True)


def _numa(numa: int | None) -> int:
    return -1 if numa is None else numa


def _hca(hca: Hca, health: HcaHealth | None) -> dict[str, Any]:
    port = next((p for p in hca.ports if p.is_up), hca.ports[0] if hca.ports else None)
    out: dict[str, Any] = {
        "name": hca.name,
        "numa": _numa(hca.numa),
        "pcieRoot": hca.pcie_root,
        "healthy": health.healthy if health else False,
    }
    if port is not None:
        out["linkLayer"] = port.link_layer.value
        out["rateGbps"] = port.rate_gbps
        out["netdev"] = port.netdev
    return out
