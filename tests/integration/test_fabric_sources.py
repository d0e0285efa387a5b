"""The node-side fabric sources: lldpd's JSON (recorded from a real lldpd), lldpcli run as a
real process, the operator's fabric file, and what the agent publishes from them."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest
import yaml

from rdmaplane.adapters.discovery import lldp
from rdmaplane.core import fabric as fab
from rdmaplane.core import nrt
from rdmaplane.core.allocation import Allocations
from rdmaplane.core.model import NodeTopology
from rdmaplane.core.settings.agent import FabricSettings
from rdmaplane.services.agent.fabric import NOTHING, FabricSource
from rdmaplane.services.agent.policy import desired as want
from rdmaplane.services.agent.policy.inventory import nrt_object
from tests.fabrics import rail_optimised

FIXTURES = Path(__file__).parents[1] / "fixtures" / "lldp"


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


@pytest.mark.parametrize("name", ["neighbors-json.json", "neighbors-json0.json"])
def test_both_encodings_of_real_lldpd_output(name: str) -> None:
    found = lldp.parse_neighbors(fixture(name))
    assert {n: (x.switch, x.switch_port) for n, x in found.items()} == {
        "ens1np0": ("leaf-a", "Ethernet1"),
        "ens2np0": ("leaf-b", "Ethernet5"),
    }
    assert found["ens1np0"].chassis_id == "5e:6f:06:dc:0f:f2"


def test_one_interface_and_none() -> None:
    assert list(lldp.parse_neighbors(fixture("neighbors-one-json.json"))) == ["ens1np0"]
    assert lldp.parse_neighbors(fixture("neighbors-none.json")) == {}


@pytest.mark.parametrize(
    "doc",
    [
        {"lldp": {"interface": {"eth0": {"chassis": {"id": {"type": "mac", "value": "aa:bb"}}}}}},
        {"lldp": {"interface": {"eth0": {"chassis": "x"}}}},
        {"lldp": [{"interface": [{"name": "eth0", "chassis": []}]}]},
        {"lldp": []},
        [],
        "nonsense",
        {"lldp": {"interface": [{"eth0": None}, 3]}},
    ],
)
def test_odd_shapes_never_raise(doc: Any) -> None:
    found = lldp.parse_neighbors(doc)
    assert all(n.switch for n in found.values())
    if "aa:bb" in json.dumps(doc):  # a chassis without a system name: named by its id
        assert found["eth0"].switch == "aa:bb"


def fake_lldpcli(tmp_path: Path, output: str, code: int = 0) -> list[str]:
    script = tmp_path / "lldpcli"
    stream = "" if code == 0 else " >&2"  # lldpcli says what failed on stderr
    script.write_text(f"#!/bin/sh\ncat{stream} <<'EOF'\n{output}\nEOF\nexit {code}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return [str(script), "-f", "json", "show", "neighbors"]


def test_lldpcli_run_as_a_process(tmp_path: Path) -> None:
    command = fake_lldpcli(tmp_path, (FIXTURES / "neighbors-json.json").read_text())
    found, problem = lldp.read_neighbors(command)
    assert problem is None and set(found) == {"ens1np0", "ens2np0"}
    assert lldp.read_neighbors(["no-such-lldpcli"]) == ({}, "no-such-lldpcli not found")
    broken = fake_lldpcli(tmp_path, "unable to connect to socket", code=1)
    found, problem = lldp.read_neighbors(broken)
    assert found == {} and problem and problem.endswith("unable to connect to socket")


def hgx_lldp(tmp_path: Path) -> list[str]:
    """lldpcli answering for the hgx-h100-roce sample: NIC i's netdev on rail leaf i."""
    interfaces = [
        {
            f"ens{108 + i}np0": {
                "chassis": {f"su0-rail{i}": {}},
                "port": {"id": {"type": "ifname", "value": "Ethernet3"}},
            }
        }
        for i in range(8)
    ]
    return fake_lldpcli(tmp_path, json.dumps({"lldp": {"interface": interfaces}}))


def test_the_agent_publishes_lldp_neighbours(
    tmp_path: Path, sample_nodes: dict[str, NodeTopology]
) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    source = FabricSource(FabricSettings(lldp_command=tuple(hgx_lldp(tmp_path))), "gpu-7")
    got = source.read(topo)
    assert got.source == "lldp"
    tier0 = fab.collapse(f"su0-rail{i}" for i in range(8))
    assert got.labels == {"fabric.topograph.run/tier-0": tier0}
    assert [(u.hca, u.switch, u.rail, u.switch_port) for u in got.uplinks] == [
        (f"mlx5_{i}", f"su0-rail{i}", i, "Ethernet3") for i in range(8)
    ]
    patch = want.owned_labels(got.labels, source.owned_keys)
    assert patch["fabric.topograph.run/tier-0"] == tier0
    assert patch["fabric.topograph.run/tier-2"] is None  # owned, not known: removed
    obj = nrt_object(
        "gpu-7", topo, [], {}, Allocations(), gpu_resource=nrt.GPU, policy="none",
        scope="container", uplinks=got.uplinks,
    )  # fmt: skip
    back = nrt.from_object(obj)
    assert [(u.hca, u.switch, u.rail) for u in back.uplinks()] == [
        (f"mlx5_{i}", f"su0-rail{i}", i) for i in range(8)
    ]
    hca0 = next(z for z in back.zones if z.name == "mlx5_0")
    assert hca0.type == nrt.ZONE_HCA and hca0.parent == topo.hca("mlx5_0").pcie_root


def test_the_fabric_file_names_the_higher_tiers(
    tmp_path: Path, sample_nodes: dict[str, NodeTopology]
) -> None:
    doc = rail_optimised(units=2, per_unit=4, rails=8)
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump(doc))
    config = FabricSettings(file=path, lldp="off", tier_labels=("example.com/t0", "example.com/t1"))
    got = FabricSource(config, "gpu-005").read(sample_nodes["hgx-h100-roce"])
    assert got.source == "file"
    assert got.labels["example.com/t0"] == "su1"
    assert got.labels["example.com/t1"].startswith("rails-")  # the set of rail spines
    assert len(got.uplinks) == 8 and got.uplinks[3].switch_port == "Ethernet2"


def test_no_source_owns_no_label(sample_nodes: dict[str, NodeTopology]) -> None:
    source = FabricSource(FabricSettings(lldp="off"), "n")
    assert source.read(sample_nodes["hgx-h100-roce"]) is NOTHING and source.owned_keys == ()
    none_here = FabricSource(FabricSettings(lldp_command=("no-such-lldpcli",)), "n")
    assert none_here.owned_keys == ()  # topograph's labels stay untouched


def test_a_broken_fabric_file_falls_back_to_lldp(
    tmp_path: Path, sample_nodes: dict[str, NodeTopology], caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fabric.yaml"
    path.write_text("kind: Fabric\nswitches: []\n")
    config = FabricSettings(file=path, lldp_command=tuple(hgx_lldp(tmp_path)))
    got = FabricSource(config, "gpu-7").read(sample_nodes["hgx-h100-roce"])
    assert got.source == "lldp"
    assert f"{path}: apiVersion: Field required; trying LLDP" in caplog.text
    assert os.path.exists(path)
