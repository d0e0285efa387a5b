"""The agent acting on RDMA faults (`actor`)."""

from rdmaplane.services.agent.faults.actor import (
    FaultActor,
    Freshness,
    device_hcas,
    notice,
    stale_view,
)

__all__ = ["FaultActor", "Freshness", "device_hcas", "notice", "stale_view"]
