"""Every name of ours in the Kubernetes API, in one place (as dranet keeps its in `pkg/apis`):
the `rdmaplane.io/` resources, labels, annotations, taints, attributes and document versions,
the conditions and the DRA driver name. Each is a contract with users, with their tooling and
with the other components (docs/architecture.md, "Contracts"): a value is never renamed.

The modules that write or read a name import it from here (some bind it under a name of their
own, e.g. `rdmaplane.core.resources.HCA`); the tests keep the values as literals, the judge of
the contract. Pure: constants only.
"""

from __future__ import annotations

from typing import Final

DOMAIN: Final = "rdmaplane.io"  # the prefix of every label, annotation, taint and resource

# ------------------------------------------------------------------------ extended resources
# The device plugin's default pools (`rdmaplane.core.resources`): one device is one HCA, or
# one slot of a shared pool that grants every HCA of it.
HCA: Final = "rdmaplane.io/hca"
HCA_SHARED: Final = "rdmaplane.io/hca-shared"

# ------------------------------------------------------------------------ DRA
DRA_DRIVER: Final = "rdma.rdmaplane.io"  # the default driver name (`DraSettings.driver_name`)
# The Node label deploy/dra/ puts on the nodes whose agent runs as the DRA driver: the default
# DRA pool the webhook recognises (`rdmaplane.core.settings.webhook`).
KUBELET_PLUGIN_LABEL: Final = "rdmaplane.io/kubelet-plugin"
# ResourceClaim device conditions (`rdmaplane.services.dra.policy.readiness`).
CLAIM_READY_CONDITION: Final = "rdmaplane.io/rdma-ready"
CLAIM_FAILED_CONDITION: Final = "rdmaplane.io/rdma-failed"

# ------------------------------------------------------------------------ Node: the agent's
# Labels (`rdmaplane.core.nrt`), one per fact the scheduler and users select on.
RDMA_LABEL: Final = "rdmaplane.io/rdma"  # "true" when there is an RDMA HCA to offer
LINK_LAYER_LABEL: Final = "rdmaplane.io/link-layer"  # Ethernet | InfiniBand, when all agree
RATE_GBPS_LABEL: Final = "rdmaplane.io/rate-gbps"
GID_INDEX_LABEL: Final = "rdmaplane.io/gid-index"  # only when uniform on the node
RDMA_NETNS_LABEL: Final = "rdmaplane.io/rdma-netns"  # shared | exclusive, when known
# While a compute port has a fatal fault: when it began (Unix seconds); the blast-radius
# breaker's census counts the faulty nodes by it (`rdmaplane.services.agent.breaker`).
FAULT_SINCE_LABEL: Final = "rdmaplane.io/fault-since"
# Annotations.
TOPOLOGY_ANNOTATION: Final = "rdmaplane.io/topology"  # the agent's view, for humans
DEVICES_FREED_ANNOTATION: Final = "rdmaplane.io/devices-freed"  # an NRT write freed devices
FAULT_HISTORY_ANNOTATION: Final = "rdmaplane.io/fault-history"  # `rdmaplane.core.repeat`
FAULT_CLEAR_ANNOTATION: Final = "rdmaplane.io/fault-clear"  # the operator's: forget a port
# Taints.
UNHEALTHY_TAINT: Final = "rdmaplane.io/rdma-unhealthy"  # also the DRA devices' taint key
QUARANTINE_TAINT: Final = "rdmaplane.io/rdma-quarantine"
# The Node condition.
READY_CONDITION: Final = "RDMAReady"

# ------------------------------------------------------------------------ Pods
# The fault notice (its document: `rdmaplane.core.notice`) and the condition set before an
# eviction.
FAULT_ANNOTATION: Final = "rdmaplane.io/fault"
FAULT_CONDITION: Final = "RDMAFault"
# The admission webhook's: a pod's RDMA mode (auto|exclusive|shared|off), the doctor init
# container, and the label a namespace opts in with.
RDMA_MODE_ANNOTATION: Final = "rdmaplane.io/rdma"  # the key of RDMA_LABEL, on another kind
DOCTOR_ANNOTATION: Final = "rdmaplane.io/doctor"
INJECT_LABEL: Final = "rdmaplane.io/inject"
# Job peers for the scheduler extender (`rdmaplane.services.scheduler.policy.jobaware`).
GROUP_LABEL: Final = "rdmaplane.io/group"
GROUP_SIZE: Final = "rdmaplane.io/group-size"  # label or annotation
KV_PEERS: Final = "rdmaplane.io/kv-peers"  # a decode pod's prefill group
# `rdmaplane doctor pair`'s Jobs: the pair they test.
PAIR_LABEL: Final = "rdmaplane.io/pair"

# ------------------------------------------------------------------------ Lease
# The fleet's fault budget (`rdmaplane.services.agent.breaker`).
FAULT_BUDGET_ANNOTATION: Final = "rdmaplane.io/fault-budget"

# ------------------------------------------------------------------------ NodeResourceTopology
# Node-level attributes (`rdmaplane.core.nrt`).
ACCOUNTED_PODS_ATTR: Final = "rdmaplane.io/accounted-pods"
HCA_FIRMWARE_ATTR: Final = "rdmaplane.io/hca-firmware"
PCIE_DOWNTRAINED_ATTR: Final = "rdmaplane.io/pcie-downtrained"
RESOURCES_ATTR: Final = "rdmaplane.io/resources"
# Zone attributes.
SHARED_HCAS_ATTR: Final = "rdmaplane.io/shared-hcas"
TIER0_SWITCH_ATTR: Final = "rdmaplane.io/tier-0-switch"
RAIL_ATTR: Final = "rdmaplane.io/rail"
SWITCH_PORT_ATTR: Final = "rdmaplane.io/switch-port"

# ------------------------------------------------------------------------ fabric export
# Volcano HyperNodes written from the fabric (`rdmaplane.core.fabric_export`).
FABRIC_TIER_LABEL: Final = "rdmaplane.io/fabric-tier"
FABRIC_ID_ANNOTATION: Final = "rdmaplane.io/fabric-id"

# ------------------------------------------------------------------------ documents
CONFIG_API_VERSION: Final = "rdmaplane.io/v1alpha1"  # every config file's `apiVersion`
NODE_TOPOLOGY_SCHEMA: Final = "rdmaplane.io/node-topology/v1"  # `rdmaplane inspect -o json`
DOCTOR_SCHEMA: Final = "rdmaplane.io/doctor/v1"  # the doctor's JSON report
FABRIC_SCHEMA: Final = "rdmaplane.io/fabric/v1"  # `rdmaplane fabric` JSON
DRA_CHECKPOINT_VERSION: Final = "rdmaplane.io/dra-checkpoint/v1"  # the DRA driver's state file
