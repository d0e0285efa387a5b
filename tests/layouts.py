"""GPU/RDMA node layouts as published NRTs, for benchmarks, tests and demos.

`layout(kind, ...)` takes the name of a bundled discovery sample (`rdmaplane samples`: the
sample's sysfs tree is read and its GPUs and compute HCAs published through `nrt.build`, as the
agent will) or of one of these synthetic layouts, quick to build and modelled on real machines:

- `hgx`: HGX H100-class, 2 NUMA nodes, 8 PCIe roots each with one GPU and one 400G NIC;
- `dgx-a100`: DGX A100-class, 8 NUMA nodes (2 sockets x NPS4), GPUs and NICs on four of them,
  two GPUs and two NICs behind each two-level switch;
- `one-socket-nics`: 8 GPUs over 2 sockets, all 8 NICs on socket 0 (half the GPUs have none);
- `split-roots`: a PCIe server, per socket 4 GPUs behind two switches and 2 NICs on a third
  root complex: NUMA alignment is possible, PCIe pairing never;
- `hgx-shared`: the HGX layout with its NICs in one shared pool of 16 slots; each slot grants
  the whole pool, so (as the agent publishes it) every slot counts in both NUMA zones.

`hgx_uplinks(switches)` cables the HGX layout's NIC i (`mlx5_i`, rail i) into `switches[i]`,
for NRTs that carry HCA zones (a rail-optimised fabric).
"""

from __future__ import annotations

import functools

from rdmaplane.adapters.discovery import samples
from rdmaplane.core import model, nrt

LAYOUTS = ("hgx", "dgx-a100", "one-socket-nics", "split-roots", "hgx-shared")

_TWO_SOCKETS = {0: {0: 10, 1: 21}, 1: {0: 21, 1: 10}}
_DGX_NUMA = {
    i: {j: 10 if i == j else (12 if i // 4 == j // 4 else 32) for j in range(8)} for i in range(8)
}
_HGX_ROOTS = (
    "pci0000:15",
    "pci0000:37",
    "pci0000:48",
    "pci0000:59",
    "pci0000:97",
    "pci0000:a8",
    "pci0000:b9",
    "pci0000:ca",
)


def hgx_uplinks(switches: list[str]) -> list[nrt.Uplink]:
    return [
        nrt.Uplink(f"mlx5_{i}", switch, i, f"Ethernet{i + 1}", i // 4, _HGX_ROOTS[i])
        for i, switch in enumerate(switches)
    ]


def layout(
    kind: str,
    name: str,
    *,
    policy: str = "best-effort",
    scope: str = "container",
    uplinks: list[nrt.Uplink] | None = None,
) -> nrt.NodeResourceTopology:
    """A fully free node of the given layout (synthetic layouts: with HCA zones for
    `uplinks`)."""
    if kind in samples.names():
        topology = _sample(kind)
        return nrt.build(
            name,
            nrt.devices_from_topology(topology),
            policy=policy,
            scope=scope,
            distances=nrt.numa_distances(topology),
        )
    devices: list[nrt.Device] = []
    pool: list[nrt.PoolHca] = []
    distances = _TWO_SOCKETS
    if kind in ("hgx", "hgx-shared"):
        for i, root in enumerate(_HGX_ROOTS):
            devices.append(nrt.Device(nrt.GPU, i // 4, root))
            if kind == "hgx":
                devices.append(nrt.Device(nrt.HCA, i // 4, root))
            else:
                pool.append(nrt.PoolHca(nrt.HCA_SHARED, i // 4, root))
        if kind == "hgx-shared":
            devices += [nrt.Device(nrt.HCA_SHARED, numa) for numa in (0, 1) for _ in range(16)]
    elif kind == "dgx-a100":
        distances = _DGX_NUMA
        for numa, root in (
            (3, "pci0000:00"),
            (1, "pci0000:40"),
            (7, "pci0000:80"),
            (5, "pci0000:c0"),
        ):
            devices += [nrt.Device(nrt.GPU, numa, root), nrt.Device(nrt.GPU, numa, root)]
            devices += [nrt.Device(nrt.HCA, numa, root), nrt.Device(nrt.HCA, numa, root)]
    elif kind == "one-socket-nics":
        for i, root in enumerate(_HGX_ROOTS):
            devices.append(nrt.Device(nrt.GPU, i // 4, root))
            if i < 4:
                devices.append(nrt.Device(nrt.HCA, 0, root))
        devices += [nrt.Device(nrt.HCA, 0, f"pci0000:{0x20 + i:02x}") for i in range(4)]
    elif kind == "split-roots":
        for numa in (0, 1):
            for sw in range(2):
                devices += [nrt.Device(nrt.GPU, numa, f"pci0000:{numa}{sw}")] * 2
            devices += [nrt.Device(nrt.HCA, numa, f"pci0000:{numa}f")] * 2
    else:
        known = ", ".join((*LAYOUTS, *samples.names()))
        raise ValueError(f"unknown layout {kind!r}; known: {known}")
    return nrt.build(
        name,
        devices,
        policy=policy,
        scope=scope,
        distances=distances,
        shared_pool_hcas=pool,
        uplinks=uplinks or (),
    )


@functools.cache
def _sample(name: str) -> model.NodeTopology:
    return samples.read_sample(name)
