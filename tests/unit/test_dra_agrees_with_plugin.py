"""The DRA driver's slice and the device plugin agree on every device of every bundled sample:
a port the plugin reports Unhealthy is tainted NoSchedule in the slice with the same reason,
and a port it reports Healthy carries no such taint. Both are the real thing (the plugin's
ResourceManager, the driver as the agent runs it, reading the same device-node folder, both fed
the faults the agent's health monitor reports from the same polls); the slice is the wire form
the publisher writes. The device plugin's pool is taken as exclusive,
as every DRA device is (one claim's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from rdmaplane.adapters.config import load, parse
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.discovery.samples import names, read_sample
from rdmaplane.core.faults import TAINT_KEY
from rdmaplane.core.model import NodeTopology, PortObservation
from rdmaplane.core.porthealth import rule_table
from rdmaplane.core.selectors import compute_ports
from rdmaplane.core.settings.agent import AgentSettings
from rdmaplane.core.settings.deviceplugin import PluginSettings, Pool
from rdmaplane.core.settings.dra import DraSettings
from rdmaplane.core.usability import REPORTED_FAULT
from rdmaplane.services.agent.policy.health import (
    HealthState,
    reported_by_hca,
    reported_by_port,
    step,
)
from rdmaplane.services.deviceplugin.manager import ResourceManager
from rdmaplane.services.dra.driver import DraDriver
from rdmaplane.services.dra.policy.slices import UNUSABLE_EFFECT, slice_objects, taint_object
from tests.unit.test_deviceplugin_resources import device_nodes
from tests.unit.test_dra_devices import with_ports_down

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SAMPLES = {name: read_sample(name) for name in names()}
ADDED = "2026-01-02T03:04:05Z"


def _dra_deploy_pools() -> PluginSettings:
    docs = yaml.safe_load_all((DEPLOY / "dra" / "daemonset.yaml").read_text())
    config_map = next(d for d in docs if d["kind"] == "ConfigMap")
    text = config_map["data"]["device-plugin.yaml"]
    return parse(yaml.safe_load(text), DEVICE_PLUGIN_CONFIG, "deploy/dra/daemonset.yaml")


CONFIGS = {
    "default": PluginSettings(),
    "deploy/dra": _dra_deploy_pools(),
    "config-exclusive": load(DEPLOY / "device-plugin/config-exclusive.yaml", DEVICE_PLUGIN_CONFIG),
    "config-shared": load(DEPLOY / "device-plugin/config-shared.yaml", DEVICE_PLUGIN_CONFIG),
}


def storage_and_first_compute(topo: NodeTopology) -> tuple[str, ...]:
    """The HCAs of the node's slower ports (storage: never the compute class) and its first
    compute HCA: the ports to set down."""
    fast = sorted({h.name for h, _ in compute_ports(topo)})
    return (*(h.name for h in topo.hcas if h.name not in fast), *fast[:1])


def variants(topo: NodeTopology) -> dict[str, tuple[NodeTopology, set[str], tuple[str, ...]]]:
    """The node as it is; with `storage_and_first_compute` down; with the first HCA's verbs
    device node missing; with `storage_and_first_compute`'s error counters rising. (topology,
    missing device nodes, HCAs whose counters rise)."""
    first = topo.hcas[0]
    return {
        "as is": (topo, set(), ()),
        "ports down": (with_ports_down(topo, *storage_and_first_compute(topo)), set(), ()),
        "no device node": (topo, {first.uverbs} if first.uverbs else set(), ()),
        "errors rising": (topo, set(), storage_and_first_compute(topo)),
    }


def health(topo: NodeTopology, rising: Sequence[str]) -> HealthState:
    """The agent's health monitor after two polls of every port, `symbol_error` rising by 50
    between them on the ports of `rising` (the threshold here is 10)."""
    rules = rule_table(60.0, {"symbol_error": 10}, {})
    state = HealthState()
    for now, risen in ((0.0, 0), (5.0, 50)):
        observations = [
            PortObservation(
                h.name,
                p.number,
                p.state,
                p.phys_state,
                {"symbol_error": risen if h.name in rising else 0},
            )
            for h in topo.hcas
            for p in h.ports
        ]
        state, _ = step(state, now, observations, rules)
    return state


def plugin_verdicts(
    topo: NodeTopology,
    pools: Sequence[Pool],
    dev_root: Path,
    faults: Mapping[str, str] | None = None,
) -> dict[tuple[str, str], str | None]:
    """(pool, HCA) → None when the device plugin reports the HCA Healthy, else its reason."""
    out: dict[tuple[str, str], str | None] = {}
    for pool in pools:
        manager = ResourceManager(replace(pool, mode="exclusive"), dev_root=str(dev_root))
        manager.update(topo, faults)
        for device in manager.devices:
            (hca,) = device.hcas
            out[(pool.resource_name, hca)] = device.problem.reason if device.problem else None
    return out


def slice_verdicts(slices: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], str | None]:
    """(pool, HCA) → None when the slice's device carries no NoSchedule taint of ours, else the
    taint's value (the reason)."""
    out: dict[tuple[str, str], str | None] = {}
    for s in slices:
        for device in s["spec"]["devices"]:
            attributes = device["attributes"]
            key = (attributes["pool"]["string"], attributes["rdmaDevice"]["string"])
            assert key not in out, f"{key}: two ports (the samples have one per HCA)"
            reasons = [
                t["value"]
                for t in device.get("taints", [])
                if t["key"] == TAINT_KEY and t["effect"] == UNUSABLE_EFFECT
            ]
            assert len(reasons) <= 1, device
            out[key] = reasons[0] if reasons else None
    return out


def published(driver: DraDriver) -> list[dict[str, Any]]:
    """The slices the publisher writes for what the driver handed it (at one timeAdded)."""
    taints = {
        name: [taint_object(t, ADDED) for t in found] for name, found in driver.taints.items()
    }
    return slice_objects(driver.driver, driver.node, list(driver.devices.values()), taints, 1)


@pytest.mark.parametrize("config", sorted(CONFIGS))
@pytest.mark.parametrize("sample", sorted(SAMPLES))
def test_slice_and_device_plugin_agree_on_every_device(
    sample: str, config: str, tmp_path: Path
) -> None:
    pools = CONFIGS[config].pools
    for variant, (topo, missing, rising) in variants(SAMPLES[sample]).items():
        root = device_nodes(topo, tmp_path / variant.replace(" ", "-"))
        for name in missing:
            (root / "infiniband" / name).unlink()
        agent = AgentSettings(
            node_name="node-a",
            device_plugin_enabled=False,
            dra=DraSettings(enabled=True),
            dev_root=root,
            kubelet_dir=tmp_path / "kubelet",
        )
        monitor = health(topo, rising)
        driver = DraDriver(agent, pools, None)
        driver.update(topo, {}, reported=reported_by_port(monitor))

        plugin = plugin_verdicts(topo, CONFIGS[config].pools, root, reported_by_hca(monitor))
        dra = slice_verdicts(published(driver))

        assert dra.keys() <= plugin.keys(), f"{variant}: offered by DRA only"
        assert {h for _, h in dra} == {h for _, h in plugin}, f"{variant}: offered by one only"
        assert dra == {k: plugin[k] for k in dra}, variant
        refused = {h for (_, h), reason in dra.items() if reason == REPORTED_FAULT}
        assert refused == set(rising) & {h for _, h in dra}, variant
