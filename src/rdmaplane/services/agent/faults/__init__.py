"""The agent acting on RDMA faults: the fault notice, the RDMAFault condition, the eviction and
the node taints, decided by `rdmaplane.core.faults` and carried out against the API server.

`FaultActor.observe` (`actor`) runs on every poll (pure steps: symptoms, hysteresis, whom it
hurts, the taint wanted); its own task (`run`) then asks `faults.decide` what to do now and does
it, so a slow or unreachable API server never stalls the poll loop. Every decision is logged and
counted (`rdmaplane_agent_fault_decisions_total{verb,outcome}`, with the actor's other figures in
`rdmaplane.services.agent.metrics.FaultMetrics`); nothing is done while the view is stale
(`view`: the API server unreachable, PodResources older than two intervals): a pod is checked to
still be ours (`pods`) before anything is written to it, and the eviction goes through the
Eviction API (`evictions`, never a delete), so PodDisruptionBudgets and the job controllers'
rules apply. The notice is `notices` (its document: `rdmaplane.core.notice`), the Node's taints
`taints`, the Events `events`.

Before an eviction or a NoExecute taint the actor asks the fleet's budget for a token (`budget`,
the blast-radius breaker, `rdmaplane.services.agent.breaker`): refused, the pods wait, their
notices say why, and the breaker opening or closing is one Event for the cluster. The Node's
fault history (`rdmaplane.services.agent.repeat`) quarantines a port that keeps failing.
"""

from rdmaplane.services.agent.faults.actor import FaultActor
from rdmaplane.services.agent.faults.notices import notice
from rdmaplane.services.agent.faults.view import Freshness, device_hcas, stale_view

__all__ = ["FaultActor", "Freshness", "device_hcas", "notice", "stale_view"]
