"""The DRA driver's figures on the agent's /metrics, read from the driver at scrape time."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from rdmaplane.services.dra.checkpoint import PREPARED
from rdmaplane.services.dra.driver import DraDriver


class DraCollector(Collector):
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def collect(self) -> Iterator[Metric]:
        d = self.driver
        yield GaugeMetricFamily(
            "rdmaplane_dra_devices", "HCA ports offered in the node's ResourceSlices",
            value=len(d.devices),
        )  # fmt: skip
        tainted = GaugeMetricFamily(
            "rdmaplane_dra_tainted_devices", "Offered devices with a taint, by effect",
            labels=["effect"],
        )  # fmt: skip
        effects = Counter(e for taints in d.taints.values() for e in {t.effect for t in taints})
        for effect, count in sorted(effects.items()):
            tainted.add_metric([effect], count)
        yield tainted
        yield GaugeMetricFamily(
            "rdmaplane_dra_prepared_claims", "Claims prepared on this node (checkpoint)",
            value=sum(e.state == PREPARED for e in d.checkpoint.entries.values()),
        )  # fmt: skip
        calls = CounterMetricFamily(
            "rdmaplane_dra_prepare_results",
            "NodePrepareResources answers per claim: prepared, cached (from the checkpoint), "
            "failed",
            labels=["result"],
        )
        for result in ("prepared", "cached", "failed"):
            calls.add_metric([result], d.stats[result])
        yield calls
        yield CounterMetricFamily(
            "rdmaplane_dra_unprepared", "Claims unprepared", value=d.stats["unprepared"]
        )
        yield GaugeMetricFamily(
            "rdmaplane_dra_health_streams",
            "The kubelet's open device health streams (DRAResourceHealth.NodeWatchResources)",
            value=d.health.streams,
        )
        if d.claim_status is not None:
            yield CounterMetricFamily(
                "rdmaplane_dra_claim_status_writes",
                "Binding conditions written into ResourceClaims (status.devices)",
                value=d.claim_status.writes,
            )
        if d.publisher is not None:
            yield GaugeMetricFamily(
                "rdmaplane_dra_pool_generation", "Generation of the node's pool on the API server",
                value=d.publisher.generation,
            )  # fmt: skip
            yield GaugeMetricFamily(
                "rdmaplane_dra_slices_in_sync",
                "1 when the API server holds the ResourceSlices the driver wants",
                value=1.0 if d.publisher.in_sync.is_set() else 0.0,
            )
