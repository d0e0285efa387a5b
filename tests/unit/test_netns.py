"""The words about the RDMA netns mode: when shared pools are blocked, and what is said."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.core.model import NetnsMode
from rdmaplane.core.netns import HOW_TO_SHARE, device_blocked, shared_pools_blocked

names = st.text("abcdefghij/._-0123456789", min_size=1, max_size=12)
pools = st.lists(st.tuples(names, st.lists(names, max_size=3)), max_size=4)


@given(st.sampled_from(list(NetnsMode)), pools)
def test_blocked_exactly_in_exclusive_mode_with_a_populated_shared_pool(mode, shared):
    said = shared_pools_blocked(mode, shared)
    populated = [(name, hcas) for name, hcas in shared if hcas]
    assert (said is not None) == (mode is NetnsMode.EXCLUSIVE and bool(populated))
    if said is not None:
        for name, hcas in populated:  # every pool that needs shared mode, with its HCAs
            assert f"{name} ({', '.join(hcas)})" in said
        assert HOW_TO_SHARE in said


def test_the_message_says_why_and_both_ways_out():
    said = shared_pools_blocked(
        NetnsMode.EXCLUSIVE, [("rdmaplane.io/hca-shared", ["mlx5_0", "mlx5_1"]), ("b/x", [])]
    )
    assert said is not None and "b/x" not in said
    assert said.startswith(
        "the RDMA subsystem is in exclusive network-namespace mode, but shared device plugin "
        "pools need shared mode: rdmaplane.io/hca-shared (mlx5_0, mlx5_1). "
    )
    assert "NCCL falls back to TCP sockets" in said
    assert "netns_mode=1" in said and "EBUSY" in said and "fixNetnsMode" in said
    assert said.endswith("serve those HCAs from exclusive pools")


@pytest.mark.parametrize("hca", ["mlx5_0", "mlx5_bond_0"])
def test_device_message_names_the_hca(hca: str):
    assert device_blocked(hca).startswith(f"{hca}: RDMA netns mode is exclusive")
