"""PCI Vital Product Data (the `vpd` file of a PCI function in sysfs): read one keyword; pure.

The format (PCI Local Bus 3.0, appendix I): resources one after another, each a tag byte and a
length; large resources (tag bit 7 set) carry a 16-bit little-endian length. The read-only
resource (large tag 0x10, byte 0x90) holds keywords: two ASCII characters, a length byte, the
data. The end tag (small resource 0x0F, byte 0x78) ends it. ConnectX-8 names its Data Direct
function's peer by the read-only keyword `VU` (the kernel's mlx5 data-direct driver reads it
there, `pci_vpd_find_ro_info_keyword(..., "VU", ...)`).

Real VPD can be malformed (the kernel's documentation says so): anything that does not parse
gives None, never an exception.
"""

from __future__ import annotations

_LARGE = 0x80
_READ_ONLY = 0x90
_END = 0x78


def ro_keyword(data: bytes, keyword: str) -> str | None:
    """The value of `keyword` in the read-only resource, as printable ASCII, or None."""
    want = keyword.encode("ascii")
    at = 0
    while at < len(data):
        tag = data[at]
        if tag == _END:
            return None
        if tag & _LARGE:
            if at + 3 > len(data):
                return None
            size = data[at + 1] | data[at + 2] << 8
            body = data[at + 3 : at + 3 + size]
            if len(body) < size:
                return None
            if tag == _READ_ONLY:
                return _keyword(body, want)
            at += 3 + size
        else:
            at += 1 + (tag & 0x07)
    return None


def _keyword(body: bytes, want: bytes) -> str | None:
    at = 0
    while at + 3 <= len(body):
        name, size = body[at : at + 2], body[at + 2]
        value = body[at + 3 : at + 3 + size]
        if name == want:
            text = value.rstrip(b"\0 ").decode("ascii", "replace")
            return text if text and text.isprintable() else None
        at += 3 + size
    return None


def encode(identifier: str, keywords: dict[str, str]) -> bytes:
    """A VPD image holding `identifier` and read-only `keywords` (what sample nodes carry)."""
    ident = identifier.encode("ascii")
    ro = b"".join(
        k.encode("ascii") + bytes([len(v)]) + v.encode("ascii") for k, v in keywords.items()
    )
    ro += b"RV\x01\x00"  # the checksum keyword a read-only resource ends with (not checked)
    return (
        bytes([0x82, len(ident) & 0xFF, len(ident) >> 8])
        + ident
        + bytes([_READ_ONLY, len(ro) & 0xFF, len(ro) >> 8])
        + ro
        + bytes([_END])
    )
