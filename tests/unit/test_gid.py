"""GID selection per port, node plans and the cluster audit."""

from __future__ import annotations

import copy
import ipaddress
from dataclasses import replace
from pathlib import Path

import pytest
from gidtables import E, hca, lladdr, node, pair, port, raw, standard
from hypothesis import given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery import samples
from rdmaplane.adapters.discovery.sysfs import read_node
from rdmaplane.core.gid import (
    GidChoice,
    GidPolicy,
    audit,
    gid_note,
    plan_node,
    select_gid,
)
from rdmaplane.core.model import Gid, LinkLayer, NodeTopology
from rdmaplane.core.selectors import Selectors, compute_ports
from rdmaplane.core.untrusted import FieldError


def choose(entries: list[E], policy: GidPolicy = GidPolicy(), **kw: object) -> GidChoice:
    return select_gid(hca("mlx5_0"), port(entries, **kw), policy)  # type: ignore[arg-type]


# ----------------------------------------------------------------- the cases the issue names


def test_standard_table_picks_ipv4_roce_v2_at_3() -> None:
    c = choose(standard(ip="10.99.91.39", netdev="ens108np0"))
    assert c.index == 3
    assert c.reason == "GID 3: RoCE v2, 10.99.91.39 on ens108np0"
    assert c.gid is not None and c.gid.ip == "10.99.91.39"


def test_sparse_container_table_without_index_0() -> None:
    assert choose(pair(4, lladdr()) + pair(6, "10.0.0.7")).index == 7
    assert choose(pair(6, lladdr()) + pair(8, "10.0.0.7")).index == 9


def test_einval_entries_are_skipped() -> None:
    # a torn-down address whose attributes fail sits before the good one
    entries = [*pair(0, lladdr()), E(2, "10.0.0.9", None), E(3, "10.0.0.9", None)]
    entries += pair(4, "10.0.0.7")
    c = choose(entries)
    assert c.index == 5
    assert gid_note(port(entries).gids[2], c) == "skipped: " + port(entries).gids[2].attrs_error


def test_only_unreadable_entries_give_no_index() -> None:
    c = choose([*pair(0, lladdr()), E(2, "10.0.0.9", None)])
    assert c.index is None
    assert "cannot be read" in c.reason and "Invalid argument" in c.reason


def test_ipv6_before_ipv4() -> None:
    entries = pair(0, lladdr()) + pair(2, "fd00:99::17") + pair(4, "10.99.1.17")
    assert choose(entries).index == 5
    six = choose(entries, GidPolicy(family=6))
    assert six.index == 3 and "fd00:99::17" in six.reason


def test_vlan_and_bond_pairs_keep_the_first_address() -> None:
    vlan = standard(netdev="ens1f0np0") + pair(4, lladdr(), "ens1f0np0.100")
    vlan += pair(6, "10.100.1.17", "ens1f0np0.100")
    assert choose(vlan).index == 3
    # the VLAN's address is chosen when a range asks for it
    c = choose(vlan, GidPolicy(cidr="10.100.0.0/16"))
    assert c.index == 7 and c.reason.endswith("on ens1f0np0.100")
    bond = standard(ip="172.16.4.17", netdev="bond0")
    assert choose(bond).reason == "GID 3: RoCE v2, 172.16.4.17 on bond0"


def test_link_local_only() -> None:
    c = choose(pair(0, lladdr()))
    assert (c.index, c.reason, c.gid) == (None, "only link-local GIDs", None)


def test_empty_table() -> None:
    assert choose([]).reason == "GID table is empty"


def test_infiniband_uses_index_0() -> None:
    entries = [E(0, "fe80::b83f:d203:50:30", 1, None)]
    c = choose(entries, link=LinkLayer.INFINIBAND)
    assert (c.index, c.roce) == (0, False)
    assert c.reason.startswith("InfiniBand: GID 0")


def test_infiniband_prefers_a_routable_flid_at_index_1() -> None:
    flid = "fec0:0000:0007:0001:b83f:d203:0050:0030"  # bytes 4-5 (third group) = FLID 7
    entries = [E(0, "fe80::b83f:d203:50:30", 1, None), E(1, flid, 1, None)]
    assert choose(entries, link=LinkLayer.INFINIBAND).index == 1
    no_flid = [E(0, "fe80::b83f:d203:50:30", 1, None), E(1, "fec0::1:b83f:d203:50:30", 1, None)]
    assert choose(no_flid, link=LinkLayer.INFINIBAND).index == 0


def test_roce_v1_only_ipv4_falls_back_like_nccl() -> None:
    c = choose([*pair(0, lladdr()), E(2, "10.0.0.1", 1)])
    assert c.index == 2 and c.reason.endswith("(no RoCE v2 GID)")


def test_roce_v1_only_ipv6_gives_no_index_like_nccl() -> None:
    c = choose([*pair(0, lladdr()), E(2, "fd00::1", 1)], GidPolicy(family=6))
    assert c.index is None and "does not fall back" in c.reason


def test_wanted_version_beats_an_earlier_other_version() -> None:
    entries = [*pair(0, lladdr()), E(2, "10.0.0.1", 2), E(3, "10.0.0.1", 1)]
    assert choose(entries, GidPolicy(roce_version=1)).index == 3


def test_range_excludes_and_says_so() -> None:
    c = choose(standard(ip="10.99.91.39"), GidPolicy(cidr="192.168.0.0/16"))
    assert c.index is None
    assert c.reason == "no IPv4 GID in 192.168.0.0/16 (10.99.91.39, 10.99.91.39 outside)"


def test_family_missing_says_so() -> None:
    assert choose(standard(), GidPolicy(family=6)).reason == "no IPv6 GID (only IPv4)"


def test_unknown_link_layer() -> None:
    assert choose(standard(), link=LinkLayer.UNKNOWN).index is None


@pytest.mark.parametrize(
    "kwargs",
    [{"family": 5}, {"roce_version": 3}, {"cidr": "10.0.0.0/33"}, {"cidr": "fd00::/8"}],
)
def test_bad_policy_names_the_field(kwargs: dict[str, object]) -> None:
    with pytest.raises(FieldError) as caught:
        GidPolicy(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == next(iter(kwargs))


# ----------------------------------------------------------------- property tests

V4 = ["10.0.0.1", "10.0.1.2", "10.1.0.3", "192.168.0.4", "172.16.0.5"]
V6 = ["fd00::1", "fd00:1::2", "2001:db8::3", "2001:db8:1::4"]
RANGES = {4: [None, "10.0.0.0/8", "10.0.1.0/24", "192.168.0.0/16"], 6: [None, "fd00::/8"]}

entry_kinds = st.one_of(
    st.just(None),  # empty: reads as zeros, the reader leaves it out
    st.builds(lambda n: ("ll", lladdr(n)), st.integers(1, 3)),
    st.builds(lambda a: ("ip", a), st.sampled_from(V4 + V6)),
)


@st.composite
def tables(draw: st.DrawFn, *, einval: bool) -> list[E]:
    n = draw(st.integers(1, 12))
    entries = []
    for i in range(n):
        kind = draw(entry_kinds)
        if kind is None or (i == 0 and kind[0] == "ip"):
            continue  # index 0 is empty or link-local on real ports
        version = draw(st.sampled_from([1, 2, None] if einval else [1, 2]))
        entries.append(E(i, kind[1], version, draw(st.sampled_from(["eth0", "eth0.7", "bond0"]))))
    return entries


@st.composite
def policies(draw: st.DrawFn) -> GidPolicy:
    family = draw(st.sampled_from([4, 6]))
    cidr, roce = draw(st.sampled_from(RANGES[family])), draw(st.sampled_from([1, 2]))
    return GidPolicy(family=family, cidr=cidr, roce_version=roce)


def brute_force(entries: list[E], policy: GidPolicy) -> int | None:
    """The rule, restated: usable = readable, global, right family, in range; the lowest index
    of the wanted version, else (IPv4 only) the lowest usable index."""
    usable = []
    for e in entries:
        ip = ipaddress.ip_address(e.address)
        if e.version is None or ip.is_link_local or ip.version != policy.family:
            continue
        if policy.cidr and ip not in ipaddress.ip_network(policy.cidr):
            continue
        usable.append(e)
    ranked = sorted(usable, key=lambda e: (e.version != policy.roce_version, e.index))
    if not ranked or (policy.family == 6 and ranked[0].version != policy.roce_version):
        return None
    return ranked[0].index


def nccl_scan(entries: list[E], table_len: int, policy: GidPolicy) -> int:
    """NCCL ≥ 2.21's walk over the table (ncclIbGetGidIndex / ncclUpdateGidIndex), restated in
    Python: start at 0, compare every later index with the best so far."""
    by_index = {e.index: e for e in entries}

    def address(i: int) -> ipaddress.IPv6Address:
        e = by_index.get(i)
        return ipaddress.IPv6Address(raw(e.address)) if e else ipaddress.IPv6Address(0)

    def family(i: int) -> int:
        return 4 if address(i).ipv4_mapped is not None else 6

    def valid(i: int) -> bool:
        a = address(i)
        return a != ipaddress.IPv6Address(0) and a.packed[:8] != bytes.fromhex("fe80" + "00" * 6)

    def in_range(i: int) -> bool:
        if policy.cidr is None:
            return True
        a = address(i)
        return (a.ipv4_mapped or a) in ipaddress.ip_network(policy.cidr)

    def version(i: int) -> int | None:
        e = by_index.get(i)
        return e.version if e else None

    best = 0
    for cand in range(1, table_len):
        fam_ok = family(cand) == policy.family and in_range(cand)
        if family(cand) != family(best) and fam_ok:
            best = cand
        elif fam_ok and valid(cand):
            differs = version(best) != version(cand) or not valid(best)
            if differs and version(cand) == policy.roce_version:
                best = cand
    return best


@given(tables(einval=True), policies())
@settings(max_examples=400)
def test_selection_equals_the_brute_force_rule(entries: list[E], policy: GidPolicy) -> None:
    assert choose(entries, policy).index == brute_force(entries, policy)


@given(tables(einval=False), policies(), st.integers(0, 4))
@settings(max_examples=400)
def test_selection_agrees_with_nccls_scan(entries: list[E], policy: GidPolicy, spare: int) -> None:
    """Where NCCL is well defined (every type readable, index 0 empty or link-local as on real
    ports) it lands where we say; when we say there is no index, it stays on index 0, which
    cannot carry traffic across nodes."""
    table_len = max([e.index for e in entries], default=0) + 1 + spare
    ours = choose(entries, policy).index
    theirs = nccl_scan(entries, table_len, policy)
    if ours is None:
        assert theirs == 0
        assert all(ipaddress.ip_address(e.address).is_link_local for e in entries if e.index == 0)
    else:
        assert theirs == ours


# ----------------------------------------------------------------- node plans


def test_plan_uniform_over_the_hgx_h100_compute_ports(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    plan = plan_node(topo, compute_ports(topo))
    assert plan.uniform_index == 3 and plan.divergent == ()
    assert [c.hca for c in plan.choices] == [f"mlx5_{i}" for i in range(8)]


def test_plan_degraded_indexes_differ_per_hca(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["degraded"]
    every = [(h, p) for h in topo.hcas for p in h.ports]
    by_name = {c.hca: c.index for c in plan_node(topo, every).choices}
    assert by_name == {"mlx5_0": 5, "mlx5_3": None, "mlx5_4": 7, "mlx5_bond_0": 3}
    up = compute_ports(topo, Selectors(hca_names=("mlx5_0", "mlx5_4", "mlx5_bond_0")))
    plan = plan_node(topo, up)
    assert plan.uniform_index is None and not plan.uniform
    assert plan.majority_index == 3  # a three-way tie goes to the lowest index
    assert [c.hca for c in plan.divergent] == ["mlx5_0", "mlx5_4"]


def test_plan_infiniband_only_has_nothing_to_unify(sample_nodes: dict[str, NodeTopology]) -> None:
    topo = sample_nodes["hgx-h200-ib"]
    plan = plan_node(topo, compute_ports(topo))
    assert plan.uniform_index is None and plan.uniform and plan.roce_choices == ()
    assert {c.index for c in plan.choices} == {0}


def test_plan_rejects_ports_of_another_node() -> None:
    topo = node(hca("mlx5_0", port(standard())))
    stranger = hca("mlx5_9", port(standard()))
    with pytest.raises(ValueError, match="mlx5_9 is not an HCA of n1"):
        plan_node(topo, [(stranger, stranger.ports[0])])


def test_plan_is_independent_of_input_order_and_duplicates(
    sample_nodes: dict[str, NodeTopology],
) -> None:
    topo = sample_nodes["hgx-h100-roce"]
    ports = compute_ports(topo)
    assert plan_node(topo, ports) == plan_node(topo, list(reversed(ports)) + ports[:2])


# ----------------------------------------------------------------- cluster audit


def _variant(tmp_path: Path, name: str, hostname: str, ipv6_first: set[str]) -> NodeTopology:
    """A copy of a sample whose listed HCAs got an IPv6 address before their IPv4 one."""
    spec = copy.deepcopy(samples.load(name).spec)
    spec["hostname"] = hostname
    for h in spec["hcas"]:
        if h["name"] in ipv6_first:
            p = h["ports"][0]
            p["addresses"] = ["fd00:99::1", *p["addresses"]]
    root = tmp_path / hostname
    samples.build(spec, root)
    return read_node(str(root))


def _renamed(node: NodeTopology, hostname: str) -> NodeTopology:
    return replace(node, hostname=hostname)


def test_audit_uniform_cluster(sample_nodes: dict[str, NodeTopology]) -> None:
    nodes = [_renamed(sample_nodes["hgx-h100-roce"], f"gpu-{i}") for i in range(3)] + [
        sample_nodes["dgx-a100"]
    ]
    result = audit(nodes)
    assert (result.cluster_index, result.uniform, result.deviations) == (3, True, ())
    assert [n.node for n in result.nodes] == ["gpu-0", "gpu-1", "gpu-2", "dgx-a100-03"]


def test_audit_names_every_deviating_node_and_hca(
    tmp_path: Path, sample_nodes: dict[str, NodeTopology]
) -> None:
    nodes = [
        _renamed(sample_nodes["hgx-h100-roce"], "gpu-0"),
        _variant(tmp_path, "hgx-h100-roce", "gpu-1", {"mlx5_2", "mlx5_6"}),
        _renamed(sample_nodes["hgx-h100-roce"], "gpu-2"),
    ]
    result = audit(nodes)
    assert result.cluster_index is None and result.majority_index == 3 and not result.uniform
    assert [(d.node, d.choice.name, d.choice.index) for d in result.deviations] == [
        ("gpu-1", "mlx5_2:1", 5),
        ("gpu-1", "mlx5_6:1", 5),
    ]
    assert result.deviations[0].why == (
        "gpu-1 mlx5_2:1: index 5, cluster uses 3 (GID 5: RoCE v2, 10.99.93.39 on ens110np0)"
    )


def test_audit_infiniband_nodes_and_duplicate_names(sample_nodes: dict[str, NodeTopology]) -> None:
    ib = sample_nodes["hgx-h200-ib"]
    result = audit([ib, ib])
    assert result.uniform and result.cluster_index is None
    assert [n.node for n in result.nodes] == ["hgx-h200-ib-042", "hgx-h200-ib-042#2"]
    assert result.nodes[0].notes == ("InfiniBand only: GID index 0, nothing to unify",)


def test_audit_node_without_compute_ports() -> None:
    result = audit([node(hca("mlx5_0", port(standard(), up=False)), hostname="quiet")])
    assert result.nodes[0].notes == ("no compute ports",) and result.uniform


def test_gid_note_explains_losers() -> None:
    entries = [*standard(), *pair(4, "10.0.0.2")]
    c = choose(entries)
    notes = [gid_note(g, c) for g in port(entries).gids]
    assert notes == [
        "link-local",
        "link-local",
        "RoCE v1, not v2",
        "chosen",
        "RoCE v1, not v2",
        "GID 3 comes first",
    ]
    six: Gid = port([E(2, "fd00::1")]).gids[0]
    assert gid_note(six, c) == "IPv6, not IPv4"


def test_gid_problem_says_why_a_forced_index_cannot_carry_roce() -> None:
    from rdmaplane.core.gid import GidPolicy, gid_problem
    from rdmaplane.core.model import Gid, GidType

    v4 = "0000:0000:0000:0000:0000:ffff:0a63:5b27"
    assert gid_problem(Gid(3, v4, GidType.ROCE_V2, "eth0")) is None
    assert gid_problem(None) == "is empty"
    assert gid_problem(Gid(2, v4, GidType.ROCE_V1, "eth0")) == "is RoCE v1, not v2"
    assert "unreadable" in (gid_problem(Gid(8, v4, None, None, "types: Invalid argument")) or "")
    ll = "fe80:0000:0000:0000:ba3f:d2ff:fe10:0070"
    assert gid_problem(Gid(1, ll, GidType.ROCE_V2, "eth0")) == "is link-local (fe80::)"
    assert gid_problem(Gid(3, v4, GidType.ROCE_V2), GidPolicy(family=6)) == "is IPv4, not IPv6"
    assert gid_problem(Gid(3, v4, GidType.ROCE_V2), GidPolicy(cidr="10.0.0.0/16")) == (
        "is outside 10.0.0.0/16"
    )
