"""TEMPORARY shim of the `gid` branch's GID policy (issue 3); removed when it lands on main."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GidPolicy:
    family: int = 4
    cidr: str | None = None
    roce_version: int = 2
