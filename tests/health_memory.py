"""A port's health memory as the agent builds it (`porthealth.remember`), for tests that need
counters that rose."""

from __future__ import annotations

from collections.abc import Mapping

from rdmaplane.core.model import PhysState, PortObservation, PortState
from rdmaplane.core.porthealth import HOUR_S, PortKey, PortMemory, remember


def risen_memory(
    risen: Mapping[str, int], key: PortKey = ("mlx5_0", 1), at: float = 0.0
) -> PortMemory:
    """The memory at `at` of a port whose counters rose by `risen` in the poll at `at`, after a
    baseline of zeros a second before."""
    up = (PortState.ACTIVE, PhysState.LINK_UP)
    zero = PortObservation(*key, *up, dict.fromkeys(risen, 0))
    before = remember({}, at - 1.0, [zero], HOUR_S)
    return remember(before, at, [PortObservation(*key, *up, dict(risen))], HOUR_S)[key]
