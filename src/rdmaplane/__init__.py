"""rdmaplane: RDMA for GPU pods on Kubernetes — discovery, GID/NCCL plan, device plugin,
node agent, topology-aware scheduling and in-pod validation."""

__version__ = "0.1.0"
# The one image of every component (the Dockerfile; `make image`): the manifests', the chart's,
# and the doctor's, for `doctor job` and the webhook's doctor init container alike.
IMAGE = f"ghcr.io/rdmaplane/rdmaplane:{__version__}"
