"""rdmaplane: RDMA for GPU pods on Kubernetes — discovery, GID/NCCL plan, device plugin,
node agent, topology-aware scheduling and in-pod validation."""

__version__ = "0.1.0"
