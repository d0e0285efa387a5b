"""The agent's fault actor, the parts that need no API server: the stale-view rule, the notice
JSON, and which HCAs each device grants."""

from __future__ import annotations

import json

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core import faults as F
from rdmaplane.services.agent.faults import Freshness, device_hcas, notice, stale_view
from rdmaplane.services.agent.policy.inventory import Offered


def test_stale_view():
    assert stale_view(Freshness(0, 100.0, 30.0), 159.0) is None
    assert stale_view(Freshness(0, 100.0, 30.0), 161.0) == (
        "PodResources older than two intervals (60 s)"
    )
    assert stale_view(Freshness(3, 100.0, 30.0), 101.0) == "API server unreachable"
    assert stale_view(Freshness(0, None, 30.0), 101.0) == "PodResources never answered"
    # The text stays the same while the cause does (a hold is logged once).
    assert stale_view(Freshness(0, 0.0, 1.0), 10.0) == stale_view(Freshness(0, 0.0, 1.0), 500.0)


def test_notice_is_the_documented_json():
    fault = F.Fault("mlx5_3", 1, F.FaultClass.FATAL, "port 1 DOWN (DISABLED)", 12.0)
    doc = json.loads(notice(fault, 1_800_000_000.0))
    assert doc == {
        "class": "fatal",
        "hca": "mlx5_3",
        "port": 1,
        "reason": "port 1 DOWN (DISABLED)",
        "since": "2027-01-15T08:00:00Z",
    }


def test_device_hcas_from_the_plugin_or_by_pci_address():
    topo = read_sample("hgx-h100-roce")
    offered = [
        Offered("rdmaplane.io/hca", "0000:18:00.0", ("mlx5_0",)),
        Offered("rdmaplane.io/hca-shared", "pool-3", ("mlx5_0", "mlx5_1"), shared=True),
    ]
    assert device_hcas(offered, topo, []) == {
        ("rdmaplane.io/hca", "0000:18:00.0"): ("mlx5_0",),
        ("rdmaplane.io/hca-shared", "pool-3"): ("mlx5_0", "mlx5_1"),
    }
    standalone = device_hcas([], topo, ["rdmaplane.io/hca"])
    first = topo.hcas[0]
    assert standalone[("rdmaplane.io/hca", first.pci.address)] == (first.name,)
