"""PCIe links that trained short (`rdmaplane.core.pcie`), read from the samples' sysfs trees, and
the fleet audit of firmware and links (`rdmaplane.core.audit`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.samples import read_sample
from rdmaplane.core import audit as A
from rdmaplane.core import pcie
from rdmaplane.core.model import PcieLink

SPEEDS = st.sampled_from([2.5, 5.0, 8.0, 16.0, 32.0, 64.0])
WIDTHS = st.sampled_from([1, 2, 4, 8, 16])


@given(SPEEDS, WIDTHS, SPEEDS, WIDTHS, st.one_of(st.none(), SPEEDS), st.one_of(st.none(), WIDTHS))
def test_downtrained_is_short_of_the_lower_of_device_and_slot(
    speed, width, mspeed, mwidth, sspeed, swidth
):
    link = PcieLink(speed, width, mspeed, mwidth, sspeed, swidth)
    best_speed, best_width = min(mspeed, sspeed or mspeed), min(mwidth, swidth or mwidth)
    assert (pcie.downtrained(link) is not None) == (speed < best_speed or width < best_width)
    assert (pcie.downtrained(link, judge_speed=False) is not None) == (width < best_width)
    gpu_slow = speed < best_speed and speed > pcie.GPU_IDLE_GTS
    assert (pcie.gpu_downtrained(link) is not None) == (gpu_slow or width < best_width)


def test_a_gpu_at_16_of_32_gts_is_downtrained_and_an_idle_one_is_not():
    """Issue 27/40: GPUs in the grey-failure rules like NICs; Gen1 is a GPU's idle speed."""
    assert pcie.gpu_downtrained(PcieLink(16.0, 16, 32.0, 16, 32.0, 16)) == (
        "PCIe link 16 GT/s x16, capable of 32 GT/s x16"
    )
    assert pcie.gpu_downtrained(PcieLink(2.5, 16, 32.0, 16, 32.0, 16)) is None
    assert pcie.gpu_downtrained(PcieLink(32.0, 16, 32.0, 16, None, None)) is None


def test_a_x16_card_in_a_x8_slot_is_as_designed():
    assert pcie.downtrained(PcieLink(16.0, 8, 16.0, 16, 16.0, 8)) is None
    assert pcie.downtrained(PcieLink(16.0, 8, 16.0, 16, 16.0, 16)) == (
        "PCIe link 16 GT/s x8, capable of 16 GT/s x16"
    )
    assert pcie.downtrained(None) is None


def test_the_degraded_sample_has_a_downtrained_nic_and_gpu():
    """Read from the sample's sysfs tree: mlx5_0 at x8 of x16 and GPU2 at x8; GPU0 idling at
    2.5 GT/s is no fault; the other samples train every link at its best."""
    found = {(d.device, d.why) for d in pcie.node_downtrained(read_sample("degraded"))}
    assert found == {
        ("mlx5_0", "PCIe link 16 GT/s x8, capable of 16 GT/s x16"),
        ("GPU2", "PCIe link 16 GT/s x8, capable of 16 GT/s x16"),
    }
    assert pcie.node_downtrained(read_sample("hgx-h100-roce")) == []


def node(name, topo):
    return A.facts_of(name, topo)


def test_the_audit_finds_the_firmware_outlier_and_the_short_links():
    hgx = read_sample("hgx-h100-roce")
    first = hgx.hcas[0]
    behind = replace(hgx, hcas=(replace(first, fw_ver="28.36.1010"), *hgx.hcas[1:]))
    result = A.audit(
        [node("a", hgx), node("b", hgx), node("c", behind), node("d", read_sample("degraded"))]
    )
    assert [(o.node, o.device, o.what) for o in result.outliers] == [
        ("c", first.name, "firmware"),
        ("d", "GPU2", "pcie"),
        ("d", "mlx5_0", "pcie"),
    ]
    kind = A.facts_of("a", hgx).firmware[0].kind
    assert result.fleet_firmware[kind] == first.fw_ver
    assert result.outliers[0].why == f"28.36.1010, the fleet runs {first.fw_ver} ({kind})"


def test_a_tie_goes_to_the_newer_version():
    facts = [
        A.NodeFacts(n, (A.Firmware("mlx5_0", "cx7", v),))
        for n, v in (("a", "28.9.1"), ("b", "28.10.2"))
    ]
    assert A.audit(facts).fleet_firmware == {"cx7": "28.10.2"}
    assert [o.node for o in A.audit(facts).outliers] == ["a"]


@pytest.mark.parametrize("sample", ["degraded", "hgx-h100-roce"])
def test_the_nrt_attributes_read_back_as_the_node_facts(sample):
    topo = read_sample(sample)
    assert A.facts_from_attributes("n", A.attributes(topo)) == A.facts_of("n", topo)


def test_attributes_that_do_not_parse_are_named():
    with pytest.raises(ValueError, match=r"rdmaplane\.io/hca-firmware: 'mlx5_0' is not"):
        A.facts_from_attributes("n", {"rdmaplane.io/hca-firmware": "mlx5_0"})
