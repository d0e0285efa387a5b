"""What the agent wants the API server to say about its node: pure functions of the node state.

The publisher compares these with what it last wrote and writes only the difference, so every
function here must be deterministic (same input → same output, byte for byte).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from rdmaplane.core import names, nrt
from rdmaplane.core.model import Hca, NodeTopology
from rdmaplane.core.netns import NETNS_EXCLUSIVE
from rdmaplane.core.porthealth import ERRORS_RISING
from rdmaplane.core.usability import PORT_DOWN
from rdmaplane.services.agent.policy.health import HcaHealth

ANNOTATION_TOPOLOGY = names.TOPOLOGY_ANNOTATION
CONDITION_TYPE = nrt.CONDITION_RDMA_READY
GID_INDEX_MISMATCH = "GidIndexMismatch"
# Every node label the agent owns: one that no longer applies is removed, not left behind.
LABELS = (
    nrt.LABEL_RDMA,
    nrt.LABEL_LINK_LAYER,
    nrt.LABEL_RATE_GBPS,
    nrt.LABEL_GID_INDEX,
    nrt.LABEL_RDMA_NETNS,
)


@dataclass(frozen=True, slots=True)
class Condition:
    status: bool
    reason: str
    message: str


def owned_labels(labels: Mapping[str, str], also: Iterable[str] = ()) -> dict[str, str | None]:
    """`nrt.node_labels` (plus fabric tier labels) as a merge patch: the labels the agent owns
    (`LABELS` and the keys in `also`) but does not set now are None, which deletes them."""
    return {name: labels.get(name) for name in (*LABELS, *also)}


def rdma_ready(
    managed: Iterable[str],
    health: Mapping[str, HcaHealth],
    gid_problem: str | None = None,
    netns_problem: str | None = None,
) -> Condition:
    """`RDMAReady`: True when every HCA the node offers to pods is healthy. A GID index that
    differs between the device plugin's pools (`gid_label`) does not make the node unready,
    but it is said: reason `GidIndexMismatch` while True, and in the message either way.
    Shared pools on an exclusive-mode node (`netns.shared_pools_blocked`) make it unready
    before anything else: their pods would see no HCA at all."""
    names = sorted(set(managed))
    if not names:
        return Condition(False, "NoRdmaDevices", "no RDMA devices found on this node")
    if netns_problem:
        return Condition(False, NETNS_EXCLUSIVE, netns_problem)
    sick = [health[n] for n in names if n in health and not health[n].healthy]
    missing = [n for n in names if n not in health]
    also = f"; {gid_problem}" if gid_problem else ""
    if not sick and not missing:
        reason = GID_INDEX_MISMATCH if gid_problem else "AllDevicesHealthy"
        return Condition(True, reason, f"{len(names)} healthy: {', '.join(names)}{also}")
    parts = [f"{h.hca}: {'; '.join(map(str, h.problems))}" for h in sick]
    parts += [f"{n}: not present" for n in missing]
    kinds = {p.reason for h in sick for p in h.problems}
    reason = next((k for k in (PORT_DOWN, ERRORS_RISING) if k in kinds), "DeviceMissing")
    message = f"{len(sick) + len(missing)} of {len(names)} unhealthy: " + " | ".join(parts)
    return Condition(False, reason, message + also)


@dataclass(frozen=True, slots=True)
class PoolGid:
    """What one device plugin pool tells its pods about the GID index."""

    resource: str
    roce: bool  # RoCE ports up in the pool (InfiniBand needs no GID index)
    index: int | None  # the NCCL_IB_GID_INDEX Allocate injects for the whole pool; None: none


def gid_label(pools: Iterable[PoolGid]) -> tuple[int | None, str | None]:
    """(the `rdmaplane.io/gid-index` value, the mismatch to report): the label names the index
    only when every pool with RoCE ports injects that same index, so it says what pods get.
    Pools that inject different indexes (different GID policies over the same or different
    HCAs) are a mismatch worth a warning; a pool injecting none (NCCL picks by address) only
    drops the label."""
    roce = [p for p in pools if p.roce]
    indexes = {p.index for p in roce}
    if len(indexes) == 1 and None not in indexes:
        return indexes.pop(), None
    concrete = [p for p in roce if p.index is not None]
    if len({p.index for p in concrete}) < 2:
        return None, None
    said = ", ".join(
        f"{p.resource} → {p.index}" for p in sorted(concrete, key=lambda p: p.resource)
    )
    return None, f"NCCL_IB_GID_INDEX differs between device plugin pools ({said})"


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
