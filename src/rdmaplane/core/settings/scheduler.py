"""How the extender scores (`SchedulerExtenderConfig`, `rdmaplane scheduler-extender --config`,
`rdmaplane explain-placement --config`; docs/scheduler-extender.md), defined once: these
frozen dataclasses are the file's schema too (see `rdmaplane.core.settings`)."""

from __future__ import annotations

from dataclasses import dataclass

from rdmaplane.core.fabric import DEFAULT_LABEL_SCHEMES
from rdmaplane.core.resources import Vocabulary
from rdmaplane.core.settings import Seconds, setting
from rdmaplane.core.untrusted import SettingsError


@dataclass(frozen=True, slots=True)
class Weights:
    """How a score is made; every weight is relative to its sibling(s).
    Score = 10 x (alignment x A + packing x P) / (alignment + packing)."""

    alignment: float = setting(0.8, "the alignment term A ...", ge=0)
    packing: float = setting(0.2, "... against the packing term P", ge=0)
    pcie: float = setting(1.0, "A: a GPU with a free NIC on its PCIe root", ge=0)
    numa: float = setting(0.5, "A: ... on its NUMA zone only", ge=0)
    cross: float = setting(0.0, "A: ... only across NUMA zones", ge=0)
    not_preferred: float = setting(
        0.5, "A x this when the kubelet does not promise NUMA alignment", ge=0, le=1
    )
    zone_fill: float = setting(0.5, "P: how full the touched zones end up", ge=0)
    node_fill: float = setting(0.5, "P: how full the node ends up", ge=0)

    def __post_init__(self) -> None:
        """Weights that make every node score the same are a mistake, not a policy."""
        if self.alignment + self.packing == 0:
            raise SettingsError("alignment and packing are both 0: every node would score 0")
        if self.alignment > 0 and max(self.pcie, self.numa, self.cross) == 0:
            raise SettingsError("pcie, numa and cross are all 0: the alignment term would be 0")
        if self.packing > 0 and self.zone_fill + self.node_fill == 0:
            raise SettingsError("zoneFill and nodeFill are both 0: the packing term would be 0")


@dataclass(frozen=True, slots=True)
class FabricScoring:
    """Job-aware scoring (docs/fabric.md): the fabric term weighed against the node-local score,
    and the node label schemes that say where a node sits (each closest tier first)."""

    weight: float = setting(0.5, "the fabric term", ge=0)
    node_local: float = setting(0.5, "... against the node-local score", ge=0)
    tier_labels: tuple[tuple[str, ...], ...] = setting(
        DEFAULT_LABEL_SCHEMES,
        "label schemes, each closest tier first; a node takes the one it has most of",
        min_length=1,
    )
    assume_for_s: Seconds = setting(
        30.0, "a job's pod counts at the node it scored best until its bind is watched", gt=0
    )


@dataclass(frozen=True, slots=True)
class ExtenderSettings:
    """The extender's scoring weights, resource names and limits."""

    weights: Weights = setting(factory=Weights, doc="scoring")
    resources: Vocabulary = setting(factory=Vocabulary, doc="names")
    max_request_bytes: int = setting(16 * 1024 * 1024, "larger request bodies get 413", gt=0)
    memo_entries: int = setting(200_000, "cached decisions (node state, request)", gt=0)
    fabric: FabricScoring = setting(factory=FabricScoring, doc="job-aware scoring")
