"""The published NRT and labels of the bundled sample nodes, as the agent will build them."""

from __future__ import annotations

from rdmaplane.core import nrt
from rdmaplane.core.model import NodeTopology
from rdmaplane.services.scheduler.policy import fit, nodestate, podrequest


def test_hgx_publishes_one_gpu_nic_pair_per_root(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    published = nrt.build(
        "hgx", nrt.devices_from_topology(topo), distances=nrt.numa_distances(topo)
    )
    assert [z.name for z in published.numa_zones()] == ["node-0", "node-1"]
    assert published.numa_zones()[0].costs == (nrt.Cost("node-0", 10), nrt.Cost("node-1", 21))
    roots = published.pcie_roots("node-0")
    assert len(roots) == 4  # the bonded storage NIC on pci0000:00 is not a compute NIC
    assert all(r.allocatable(nrt.GPU) == 1 and r.allocatable(nrt.HCA) == 1 for r in roots)
    labels = nrt.node_labels(topo, gid_index=3)
    assert labels == {
        nrt.LABEL_RDMA: "true",
        nrt.LABEL_LINK_LAYER: "Ethernet",
        nrt.LABEL_RATE_GBPS: "400",
        nrt.LABEL_GID_INDEX: "3",
        nrt.LABEL_RDMA_NETNS: "shared",
    }


def test_split_node_pairs_only_where_nics_are(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["pcie-l40s-split"]
    state = nodestate.node_state(
        nrt.build("l40s", nrt.devices_from_topology(topo), policy="single-numa-node")
    )
    assert [z.capacity for z in state.zones] == [{nrt.GPU: 4, nrt.HCA: 2}, {nrt.GPU: 4}]
    two = fit.evaluate(state, podrequest.PodRequest.of({nrt.GPU: 2, nrt.HCA: 2}))
    assert two.fits and two.alignment == "pcie"
    assert not fit.evaluate(state, podrequest.PodRequest.of({nrt.GPU: 3, nrt.HCA: 3})).fits


def test_no_rdma_no_labels(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["workstation"]
    assert nrt.node_labels(topo, hcas=[]) == {}
    assert nrt.node_labels(topo, hcas=["rxe0"]) == {}  # software RDMA has no PCI function
    assert [d.resource for d in nrt.devices_from_topology(topo, hcas=[])] == [nrt.GPU, nrt.GPU]
