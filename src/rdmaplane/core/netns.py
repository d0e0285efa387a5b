"""The RDMA network-namespace mode in words: why a shared pool needs shared mode, and how a node
gets there. One wording for the agent's `RDMAReady` condition, the device plugin's Unhealthy
devices and the doctor's finding. Pure.

In exclusive mode an RDMA device is visible only in the network namespace it belongs to. The
HCAs of a shared pool stay in the node's namespace while every pod holding a slot opens them
from its own, so those pods see no HCA and NCCL falls back to TCP sockets. An exclusive pool
hands each HCA to one pod, which works in exclusive mode when an RDMA CNI moves the HCA (an
SR-IOV VF) into that pod's namespace.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from rdmaplane.core.model import NetnsMode

NETNS_EXCLUSIVE = "NetnsExclusive"  # the condition's and the Unhealthy devices' reason

# The kernel switches modes only while no network namespace but the initial one exists (EBUSY
# otherwise), so on a node running pods the durable fix is the boot-time setting.
HOW_TO_SHARE = (
    "switch the node to shared mode at boot: ib_core module option netns_mode=1 (the default; "
    "drop any netns_mode=0 in modprobe.d and any boot-time `rdma system set netns exclusive`) "
    "and reboot; `rdma system set netns shared` works at run time only while no pod has its own "
    "network namespace (else the kernel answers EBUSY), which the agent's fixNetnsMode tries "
    "when it starts"
)
IF_EXCLUSIVE_INTENDED = (
    "if exclusive mode is intended (SR-IOV VFs moved into pods by an RDMA CNI), serve those "
    "HCAs from exclusive pools"
)


def shared_pools_blocked(mode: NetnsMode, pools: Iterable[tuple[str, Sequence[str]]]) -> str | None:
    """Why the node cannot serve its shared pools (resource name, member HCAs), or None when
    it can: not in exclusive mode, or no shared pool with an HCA."""
    needing = sorted(((name, hcas) for name, hcas in pools if hcas), key=lambda p: p[0])
    if mode is not NetnsMode.EXCLUSIVE or not needing:
        return None
    said = "; ".join(f"{name} ({', '.join(hcas)})" for name, hcas in needing)
    return (
        "the RDMA subsystem is in exclusive network-namespace mode, but shared device plugin "
        f"pools need shared mode: {said}. Pods holding a slot open HCAs that stay in the "
        "node's network namespace and see none of them (NCCL falls back to TCP sockets). "
        f"Fix: {HOW_TO_SHARE}. Or, {IF_EXCLUSIVE_INTENDED}"
    )


def device_blocked(hca: str) -> str:
    """The Unhealthy message of a shared pool's HCA on an exclusive-mode node."""
    return (
        f"{hca}: RDMA netns mode is exclusive; a shared pool needs shared (its pods would not "
        "see it)"
    )
