"""The admission webhook: GPU pods get RDMA devices, IPC_LOCK and /dev/shm (docs/webhook.md)."""
