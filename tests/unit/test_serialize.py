"""The v1 node document: contract fields, round trip, and errors that name the field."""

from __future__ import annotations

import copy
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.model import SCHEMA, Gid, NetnsMode, NodeTopology, format_cpulist, parse_cpulist
from rdmaplane.core.serialize import DocumentError, from_document, to_document


def test_contract_fields(sample_nodes: dict[str, NodeTopology]) -> None:
    doc = json.loads(json.dumps(to_document(sample_nodes["hgx-h100-roce"])))
    assert doc["schema"] == SCHEMA == "rdmaplane.io/node-topology/v1"
    assert {"numa_nodes", "gpus", "hcas", "relations"} <= set(doc)
    assert {"index", "pci", "numa", "pcie_root"} <= set(doc["gpus"][0])
    hca = doc["hcas"][0]
    assert {"name", "pci", "numa", "pcie_root", "ports"} <= set(hca)
    port = hca["ports"][0]
    assert {"port", "state", "link_layer", "rate_gbps", "netdev", "gids"} <= set(port)
    assert port["gids"][3] == {
        "index": 3,
        "gid": "0000:0000:0000:0000:0000:ffff:0a63:5b27",
        "type": "RoCE v2",
        "netdev": "ens108np0",
        "ip": "10.99.91.39",
        "attrs_error": None,
    }
    assert doc["relations"]["GPU0"]["mlx5_0"] == "PIX"
    assert set(doc["relations"]) == {f"GPU{i}" for i in range(8)} | {h["name"] for h in doc["hcas"]}


@pytest.mark.parametrize(
    "name", ["hgx-h100-roce", "degraded", "workstation", "dgx-a100", "sriov-exclusive"]
)
def test_round_trip(name: str, sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes[name]
    assert from_document(json.loads(json.dumps(to_document(topo)))) == topo


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (
            lambda d: d.update(schema="v0"),
            "schema: expected 'rdmaplane.io/node-topology/v1' .* got 'v0'",
        ),
        (lambda d: d["hcas"][0].update(name=7), "hcas[0].name: expected a string"),
        (
            lambda d: d["hcas"][0]["ports"][0].update(state="SLEEPY"),
            "hcas[0].ports[0].state: 'SLEEPY'",
        ),
        (lambda d: d["hcas"][0]["ports"][0]["gids"][0].update(gid="zz"), "gids[0].gid: not a GID"),
        (lambda d: d["gpus"][0].update(pci_device=None), "gpus[0].pci_device: expected an object"),
        (lambda d: d["numa_nodes"][0].update(cpus="a-b"), "numa_nodes[0].cpus: not a CPU list"),
        (lambda d: d.update(hcas="x"), "hcas: expected a list of objects"),
        (lambda d: d.update(netns_mode="maybe"), "netns_mode: 'maybe' is not one of shared"),
        (lambda d: d.update(netns_mode=1), "netns_mode: expected a string"),
        (
            lambda d: d["hcas"][0]["ports"][0]["gids"][0].update(type=[]),
            "gids[0].type: expected a string or null",
        ),
        (lambda d: d["gpus"][0].update(nvlinks="NV12"), "gpus[0].nvlinks: expected an object"),
        (lambda d: d["gpus"][0].update(nvlinks={"x": "4"}), "gpus[0].nvlinks.x: expected an int"),
        (lambda d: d.update(hostname="a\x1b[2J"), "hostname: control characters in"),
    ],
)
def test_bad_documents_name_the_field(
    mutate, message: str, sample_nodes: dict[str, NodeTopology]
) -> None:
    doc = copy.deepcopy(to_document(sample_nodes["hgx-h100-roce"]))
    mutate(doc)
    with pytest.raises(DocumentError, match=message.replace("[", r"\[").replace("]", r"\]")):
        from_document(doc, where="node.json")


def test_the_netns_mode_travels_and_older_documents_leave_it_unknown(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    doc = to_document(sample_nodes["sriov-exclusive"])
    assert doc["netns_mode"] == "exclusive"
    del doc["netns_mode"]
    assert from_document(doc).netns_mode is NetnsMode.UNKNOWN


def test_not_an_object() -> None:
    with pytest.raises(DocumentError, match="top level"):
        from_document([1, 2])


@given(st.sets(st.integers(0, 300), max_size=40))
def test_cpulist_round_trip(cpus: set[int]) -> None:
    t = tuple(sorted(cpus))
    assert parse_cpulist(format_cpulist(t)) == t


@pytest.mark.parametrize("junk", ["a", "3-1", "1-", "-1", "0-999999"])
def test_cpulist_junk(junk: str) -> None:
    with pytest.raises(ValueError):
        parse_cpulist(junk)


def test_gid_flags() -> None:
    ll = Gid(0, "fe80:0000:0000:0000:ba3f:d2ff:fe10:0070")
    v4 = Gid(3, "0000:0000:0000:0000:0000:ffff:0a63:5b27")
    v6 = Gid(2, "fd00:0099:0000:0000:0000:0000:0000:0017")
    zero = Gid(9, ":".join(["0000"] * 8))
    assert (ll.is_link_local, ll.family, v4.ip, v4.family, v6.family) == (
        True,
        6,
        "10.99.91.39",
        4,
        6,
    )
    assert zero.is_zero and zero.ip is None and zero.family is None


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


def _paths(doc: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """Every place in `doc` (keys and indexes from the top) that holds a value."""
    found = [at]
    children = (
        doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else []
    )
    for key, child in children:
        found += _paths(child, (*at, key))
    return found


@given(data=st.data())
def test_any_damage_is_a_document_error(sample_nodes: dict[str, NodeTopology], data) -> None:
    """Whatever a file holds in whatever place, reading it answers a node or DocumentError."""
    doc = copy.deepcopy(to_document(sample_nodes["degraded"]))
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.sampled_from(_paths(doc)[1:]))
        parent = doc
        for key in where[:-1]:
            parent = parent[key]  # type: ignore[index]
        parent[where[-1]] = data.draw(JSON)  # type: ignore[index]
    try:
        from_document(doc, where="node.json")
    except DocumentError as e:
        assert str(e).startswith("node.json: ") and "\n" not in str(e)


@pytest.mark.parametrize(
    ("key", "value"), [("width", 64), ("speed_gts", 0.0), ("max_speed_gts", 1e9)]
)
def test_a_pcie_link_no_machine_has_is_left_out_with_a_warning(
    key: str, value: float, sample_nodes: dict[str, NodeTopology]
) -> None:
    doc = to_document(sample_nodes["degraded"])
    pci = next(h["pci_device"] for h in doc["hcas"] if h["pci_device"]["link"])
    pci["link"][key] = value
    topo = from_document(doc, where="n.json")
    read = next(h for h in topo.hcas if h.pci and h.pci.address == pci["address"])
    assert read.pci is not None and read.pci.link is None
    assert any(
        f"pci_device.link.{key}: {value!r} is no PCIe link" in w.message for w in topo.warnings
    )
