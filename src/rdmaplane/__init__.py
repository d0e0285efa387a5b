"""rdmaplane: RDMA for GPU pods on Kubernetes — discovery, GID/NCCL plan, device plugin,
node agent, topology-aware scheduling and in-pod validation."""

__version__ = "0.1.0"
# The image `rdmaplane doctor` runs from (rdmaplane, perftest and the verbs libraries:
# deploy/doctor/Dockerfile): the webhook's doctor init container and `doctor job` alike.
DOCTOR_IMAGE = f"ghcr.io/rdmaplane/doctor:{__version__}"
