"""Which GID table entries NCCL and perftest can use on a RoCE port.

A stand-in for `rdmaplane.gid` (written on another branch) reduced to what the doctor needs:
valid = non-empty, readable attributes, RoCE v2, not link-local, of the wanted address family.
"""

from __future__ import annotations

from rdmaplane.model import Gid, GidType


def gid_problem(gid: Gid | None, family: int = 4) -> str | None:
    """Why this entry cannot carry RoCE v2 traffic of `family`, or None when it can."""
    if gid is None or gid.is_zero:
        return "is empty"
    if gid.type is None:
        return f"has unreadable attributes ({gid.attrs_error or 'EINVAL'})"
    if gid.type != GidType.ROCE_V2:
        return "is RoCE v1"
    if gid.is_link_local:
        return "is link-local (fe80::)"
    if gid.family != family:
        return f"is IPv{gid.family}, not IPv{family}"
    return None


def first_valid(gids: tuple[Gid, ...], family: int = 4) -> int | None:
    """The lowest usable index (what NCCL's automatic selection lands on without a range)."""
    ordered = sorted(gids, key=lambda g: g.index)
    return next((g.index for g in ordered if gid_problem(g, family) is None), None)
