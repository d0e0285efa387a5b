"""A storm of kubelet restarts against a plugin, and what each kubelet life saw.

The stand-in (`kubelet_process.py`, a process of its own) restarts as a fast kubelet does: its
server stops, every file in `device-plugins/` is deleted, a new `kubelet.sock` listens at once.
Between restarts it lives a random time: 0 (the next restart follows at once), or uniform in
[0, 1) s times `scale`. Every registration the stand-in accepts or refuses is stamped with
CLOCK_MONOTONIC and attributed to the kubelet life it fell in.

The verdict, per life: at most one registration, none refused; registered within `within_s` of
its start, unless it did not live that long (a kubelet stopped after 3 ms cannot be registered
with; the next one must be); the last life registered exactly once.

Shared by tests/integration/test_registration_storm.py and bench/registration.py.
"""

from __future__ import annotations

import asyncio
import random
import statistics
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from kubelet_process import KubeletProcess

WITHIN_S = 0.3


@dataclass
class Life:
    """One kubelet, from its `up` to the next one's (or the end of the storm)."""

    up: float
    until: float
    registered: list[float] = field(default_factory=list)  # delays after `up`, s
    refused: list[str] = field(default_factory=list)

    @property
    def lived(self) -> float:
        return self.until - self.up


@dataclass
class Storm:
    resource: str
    lives: list[Life]
    within_s: float = WITHIN_S

    @property
    def restarts(self) -> int:
        return len(self.lives) - 1  # the first life is the start, not a restart

    @property
    def per_life(self) -> Counter[int]:
        """How many lives saw 0, 1, 2... registrations."""
        return Counter(len(life.registered) for life in self.lives)

    @property
    def delays(self) -> list[float]:
        """Registration delays after each restart (the first life is the plugin's start)."""
        return [d for life in self.lives[1:] for d in life.registered]

    @property
    def short_lived(self) -> int:
        """Lives that ended before a registration could reach them (and saw none)."""
        return sum(not life.registered and life.lived < self.within_s for life in self.lives)

    @property
    def longest_unregistered(self) -> float:
        """The longest life that saw no registration, s (0 when every one did)."""
        return max((life.lived for life in self.lives if not life.registered), default=0.0)

    def problems(self) -> list[str]:
        return self.wrong() + self.late()

    def wrong(self) -> list[str]:
        """What no timing excuses: a Register refused, a kubelet registered with twice, the
        last one (after the storm settled) not exactly once."""
        found = []
        for i, life in enumerate(self.lives):
            where = f"life {i} (lived {life.lived * 1000:.1f} ms)"
            if life.refused:
                found.append(f"{where}: refused {life.refused}")
            if len(life.registered) > 1:
                found.append(f"{where}: registered {len(life.registered)} times")
        if self.lives and len(self.lives[-1].registered) != 1:
            found.append("the last kubelet was not registered exactly once")
        return found

    def late(self) -> list[str]:
        """Registrations past `within_s`, and lives that long that saw none."""
        found = []
        for i, life in enumerate(self.lives):
            where = f"life {i} (lived {life.lived * 1000:.1f} ms)"
            late = [d for d in life.registered if d > self.within_s and i > 0]
            if late:
                found.append(f"{where}: registered after {late[0] * 1000:.1f} ms")
            if not life.registered and life.lived >= self.within_s:
                found.append(f"{where}: never registered")
        return found

    def summary(self) -> str:
        d = sorted(self.delays)
        if not d:
            return f"{self.resource}: {self.restarts} restarts, no registration"
        per = ", ".join(f"{n}: {c}" for n, c in sorted(self.per_life.items()))
        return (
            f"{self.resource}: {self.restarts} restarts, registrations per kubelet life "
            f"{{{per}}} ({self.short_lived} lives shorter than {self.within_s * 1000:.0f} ms "
            f"unregistered, the longest {self.longest_unregistered * 1000:.1f} ms), "
            f"delay p50 {statistics.median(d) * 1000:.1f} ms, "
            f"p99 {d[int(0.99 * (len(d) - 1))] * 1000:.1f} ms, worst {d[-1] * 1000:.1f} ms, "
            f"refused {sum(len(life.refused) for life in self.lives)}"
        )


def interval(rng: random.Random, scale: float) -> float:
    """0 one time in ten, else uniform in [0, 1) s times `scale`."""
    return 0.0 if rng.random() < 0.1 else rng.random() * scale


async def storm(
    kubelet: KubeletProcess,
    resource: str,
    restarts: int,
    *,
    seed: int,
    scale: float,
    wipe_registry: float = 0.0,
    settle_s: float = 1.0,
    within_s: float = WITHIN_S,
) -> Storm:
    """Restart `kubelet` `restarts` times (each time wiping `plugins_registry/` too with
    probability `wipe_registry`) and attribute what it saw of `resource` to its lives. The
    plugin must have registered with the running kubelet already."""
    rng = random.Random(seed)
    start = max(i for i, e in enumerate(kubelet.log) if e["ev"] == "up")
    for _ in range(restarts):
        await asyncio.sleep(interval(rng, scale))
        await kubelet.restart(wipe_registry=rng.random() < wipe_registry)
    await asyncio.sleep(settle_s)
    return attribute(resource, kubelet.log[start:], within_s)


def attribute(resource: str, events: list[dict[str, Any]], within_s: float) -> Storm:
    """The lives of `events` (which start with an `up`)."""
    ups = [e["t"] for e in events if e["ev"] == "up"]
    end = max(e["t"] for e in events) + 1.0
    lives = [Life(t, ups[i + 1] if i + 1 < len(ups) else end) for i, t in enumerate(ups)]
    for e in events:
        if e["ev"] not in ("registered", "refused") or e.get("resource") != resource:
            continue
        life = next(life for life in reversed(lives) if life.up <= e["t"])
        if e["ev"] == "registered":
            life.registered.append(e["t"] - life.up)
        else:
            life.refused.append(e.get("error", ""))
    return Storm(resource, lives, within_s)
