"""PCI VPD: the read-only keyword a ConnectX-8 ties its Data Direct function by; junk is None."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from rdmaplane.adapters.discovery.vpd import encode, ro_keyword

ASCII = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=40)
KEYS = st.text(st.characters(min_codepoint=0x41, max_codepoint=0x5A), min_size=2, max_size=2)


@given(ASCII, st.dictionaries(KEYS, ASCII, max_size=6))
def test_every_read_only_keyword_reads_back(identifier: str, keywords: dict[str, str]) -> None:
    image = encode(identifier, keywords)
    for key, value in keywords.items():
        assert ro_keyword(image, key) == value
    if "VU" not in keywords:
        assert ro_keyword(image, "VU") is None


@given(st.binary(max_size=300), st.sampled_from(["VU", "SN", "PN"]))
def test_junk_never_raises(data: bytes, key: str) -> None:
    found = ro_keyword(data, key)
    assert found is None or (found.isprintable() and found)


def test_a_cut_image_gives_nothing_rather_than_half_a_value() -> None:
    image = encode("NVIDIA ConnectX-8", {"VU": "MT2518X00001"})
    assert ro_keyword(image, "VU") == "MT2518X00001"
    assert ro_keyword(image[: len(image) // 2], "VU") is None
