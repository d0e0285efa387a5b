"""The node's RDMA device nodes: what `<dev root>/infiniband` holds (`uverbsN`, `umadN`,
`issmN`, `rdma_cm`), the files a container can be given. Read by the device plugin and the
DRA driver at every poll (one directory listing), so a driver loaded late is seen."""

from __future__ import annotations

import os


def device_nodes(dev_root: str) -> frozenset[str]:
    """The names in `<dev_root>/infiniband`; none when it cannot be read (no RDMA driver)."""
    try:
        return frozenset(os.listdir(os.path.join(dev_root, "infiniband")))
    except OSError:
        return frozenset()
