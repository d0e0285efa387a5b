"""Which devices a container gets inside its NUMA affinity: the device plugins' choice, which
the kubelet does not make (it knows NUMA alone). Predicted as the best achievable pairing: every
GPU with a NIC on its PCIe root where possible, else on its zone, and the pairs that made. Pure.

With shared slots instead of exclusive HCAs a GPU pairs with any HCA of the slot's pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from rdmaplane.core.resources import Amounts, Vocabulary
from rdmaplane.services.scheduler.policy.nodestate import NodeState, Roots


@dataclass(slots=True)
class DevicePool:
    """Devices of one resource, per zone and root, and what one container took of them."""

    free: list[list[int]]
    took: list[list[int]]

    @classmethod
    def of(cls, counts: Sequence[Sequence[int]]) -> DevicePool:
        return cls([list(row) for row in counts], [[0] * len(row) for row in counts])

    def take(self, zone: int, root: int, count: int) -> int:
        step = min(self.free[zone][root], count)
        self.free[zone][root] -= step
        self.took[zone][root] += step
        return step

    def take_in_zone(self, zone: int, count: int, partners: Sequence[DevicePool]) -> int:
        """Up to `count` from `zone`, first from roots where the partner kind (HCAs for GPUs,
        GPUs for HCAs) has none free, so roots that can still make a pair stay whole."""
        got = 0
        free = self.free[zone]
        order = sorted(range(len(free)), key=lambda root: any(p.free[zone][root] for p in partners))
        for root in order:
            got += self.take(zone, root, count - got)
        return got


def pools_of(devices: Roots, names: Iterable[str]) -> dict[str, DevicePool]:
    """A pool per resource name of `devices`."""
    return {
        name: DevicePool.of([[held[name] for held in zone] for zone in devices]) for name in names
    }


@dataclass(frozen=True, slots=True)
class Pairing:
    """What one container pairs: its GPU resources with its exclusive HCAs, or (asking for
    shared slots and no exclusive HCA) with the HCAs of its shared pools."""

    gpus: tuple[str, ...]
    hcas: tuple[str, ...]
    pools: tuple[str, ...]  # the shared pools whose HCAs its GPUs pair with

    @classmethod
    def of(cls, vocabulary: Vocabulary, unit: Amounts) -> Pairing:
        hcas = tuple(name for name in vocabulary.exclusive if unit[name])
        pools = () if hcas else tuple(name for name in vocabulary.shared if unit[name])
        return cls(tuple(name for name in vocabulary.gpus if unit[name]), hcas, pools)

    def near_pool(self, pool_hcas: Amounts) -> bool:
        return any(pool_hcas[pool] for pool in self.pools)

    def pairs(self, gpus: int, hcas: int, pool_hcas: Amounts) -> int:
        """Pairs among `gpus` and `hcas` held in one place (a root, a zone) with `pool_hcas`."""
        if self.pools:
            return gpus if self.near_pool(pool_hcas) else 0
        return min(gpus, hcas)


def take_pairs(
    state: NodeState,
    pools: Mapping[str, DevicePool],
    need: dict[str, int],
    order: Sequence[int],
    pairing: Pairing,
) -> Roots:
    """Take GPUs and HCAs from `pools` in the zones in `order`: pairs on one PCIe root first,
    then pairs within a zone, then the rest; `need` goes down by what was taken. With shared
    slots instead of HCAs a GPU pairs with any HCA of the pool, so GPUs on roots with pool HCAs
    go first."""
    vocab = state.vocabulary
    partners = {
        name: [pools[other] for other in (vocab.exclusive if name in vocab.gpus else vocab.gpus)]
        for name in pools
    }
    for z in order:  # 1. pairs on one PCIe root (z: a zone's index, i: a root's in it)
        for i, root in enumerate(state.zones[z].roots):
            if not root.name:
                continue
            if pairing.pools and pairing.near_pool(root.pool_hcas):
                for gpu in pairing.gpus:
                    need[gpu] -= pools[gpu].take(z, i, need[gpu])
            for gpu in pairing.gpus:
                for hca in pairing.hcas:
                    step = min(pools[gpu].free[z][i], pools[hca].free[z][i], need[gpu], need[hca])
                    need[gpu] -= pools[gpu].take(z, i, step)
                    need[hca] -= pools[hca].take(z, i, step)
    for z in order:  # 2. pairs within a NUMA zone
        if pairing.pools and pairing.near_pool(state.zones[z].pool_hcas):
            for gpu in pairing.gpus:
                need[gpu] -= pools[gpu].take_in_zone(z, need[gpu], partners[gpu])
        for gpu in pairing.gpus:
            for hca in pairing.hcas:
                pairs = min(sum(pools[gpu].free[z]), sum(pools[hca].free[z]), need[gpu], need[hca])
                need[gpu] -= pools[gpu].take_in_zone(z, pairs, partners[gpu])
                need[hca] -= pools[hca].take_in_zone(z, pairs, partners[hca])
    for z in order:  # 3. whatever is left
        for name in (*pairing.gpus, *pairing.hcas):
            need[name] -= pools[name].take_in_zone(z, need[name], partners[name])
    return tuple(
        tuple(
            Amounts((name, pool.took[z][i]) for name, pool in pools.items())
            for i in range(len(zone.roots))
        )
        for z, zone in enumerate(state.zones)
    )


def count_pairs(state: NodeState, unit: Amounts, devices: Roots) -> tuple[int, int, int]:
    """A container's GPU-NIC pairs on one PCIe root, on one NUMA zone (those on a root too),
    and the pairs a perfect placement would make, for `unit` held as `devices`."""
    vocab = state.vocabulary
    pairing = Pairing.of(vocab, unit)
    gpus = sum(unit[name] for name in vocab.gpus)
    hcas = sum(unit[name] for name in vocab.exclusive)
    needed = min(gpus, hcas) if hcas else (gpus if pairing.pools else 0)
    pcie = numa = 0
    for zone, held_in_zone in zip(state.zones, devices, strict=True):
        zone_gpus = zone_hcas = 0
        for root, held in zip(zone.roots, held_in_zone, strict=True):
            root_gpus = sum(held[name] for name in vocab.gpus)
            root_hcas = sum(held[name] for name in vocab.exclusive)
            zone_gpus, zone_hcas = zone_gpus + root_gpus, zone_hcas + root_hcas
            if root.name:
                pcie += pairing.pairs(root_gpus, root_hcas, root.pool_hcas)
        numa += pairing.pairs(zone_gpus, zone_hcas, zone.pool_hcas)
    return min(pcie, needed), min(numa, needed), needed
