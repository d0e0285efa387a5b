"""GPU facts that sysfs lacks (UUID, product name, NVLinks), from NVML when it is there.

Optional: without `nvidia-ml-py` or a driver this returns nothing and GPUs carry no UUID.
NVLinks are reported per GPU pair as `nvidia-smi topo -m` counts them: links straight to the
peer, plus, on NVSwitch systems, the fewer of the two GPUs' links into the switch fabric.
"""

from __future__ import annotations

import contextlib
from typing import Any


def gpu_info() -> dict[str, dict[str, Any]]:
    """PCI address (`0000:18:00.0`) → {uuid, name, nvlinks: {peer address: links}}."""
    try:
        import pynvml
    except ImportError:
        return {}
    try:
        pynvml.nvmlInit()
    except Exception:  # NVMLError_LibraryNotFound, DriverNotLoaded, …
        return {}
    try:
        return _collect(pynvml)
    except Exception:
        return {}
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _collect(nvml: Any) -> dict[str, dict[str, Any]]:
    info: dict[str, dict[str, Any]] = {}
    remotes: dict[str, dict[str, int]] = {}
    for i in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(i)
        address = _address(nvml.nvmlDeviceGetPciInfo(handle).busId)
        info[address] = {
            "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
            "name": _text(nvml.nvmlDeviceGetName(handle)),
        }
        remotes[address] = {}
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            try:
                if not nvml.nvmlDeviceGetNvLinkState(handle, link):
                    continue
                peer = _address(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId)
            except Exception:  # link not supported on this GPU
                break
            remotes[address][peer] = remotes[address].get(peer, 0) + 1
    for address, peers in remotes.items():
        fabric = sum(n for p, n in peers.items() if p not in info)
        links = {p: n for p, n in peers.items() if p in info}
        for other, their in remotes.items():
            their_fabric = sum(n for p, n in their.items() if p not in info)
            if other != address and fabric and their_fabric:
                links[other] = links.get(other, 0) + min(fabric, their_fabric)
        info[address]["nvlinks"] = links
    return info


def _text(v: str | bytes) -> str:
    return v.decode() if isinstance(v, bytes) else v


def _address(bus_id: str | bytes) -> str:
    """NVML prints `00000000:18:00.0`; sysfs names the function `0000:18:00.0`."""
    text = _text(bus_id).lower()
    domain, rest = text.split(":", 1)
    return f"{int(domain, 16):04x}:{rest}"
