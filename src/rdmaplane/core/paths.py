"""Where things are on a node, by default: sysfs, the device nodes, the kubelet's folder and the
sockets and folders below it, the CDI spec folder. Every component's settings, the CLI's flags
and the adapters' default arguments take them from here. All are configurable (in a DaemonSet
the host's /sys and /dev are usually mounted at /host/sys and /host/dev); these are what a
process on the node itself sees.

Pure: names of paths only, never a look at the filesystem. (Where a pod finds its annotations
for the fault notice is the notice contract's, `rdmaplane.core.notice`.)
"""

from __future__ import annotations

from typing import Final

SYSFS: Final = "/sys"  # discovery reads class/infiniband, bus/pci, class/net below it
DEV: Final = "/dev"  # the device nodes handed to containers: DEV/infiniband/uverbsN, rdma_cm
KUBELET_DIR: Final = "/var/lib/kubelet"  # the kubelet's --root-dir
CDI_DIR: Final = "/var/run/cdi"  # where CDI specs go (the runtimes read /etc/cdi and this)

# Below the kubelet's folder.
DEVICE_PLUGINS: Final = "device-plugins"  # device plugins' sockets and the kubelet's own
KUBELET_SOCKET: Final = "kubelet.sock"  # the kubelet's socket in DEVICE_PLUGINS, POD_RESOURCES
PLUGINS_REGISTRY: Final = "plugins_registry"  # the plugin watcher's registration sockets
PLUGINS: Final = "plugins"  # a DRA driver's own folder: PLUGINS/<driver name>
POD_RESOURCES: Final = "pod-resources"  # the PodResources API: POD_RESOURCES/KUBELET_SOCKET
KUBELET_CONFIG: Final = "config.yaml"  # the kubelet's configuration file (kubeadm's place)
