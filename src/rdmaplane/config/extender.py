"""`SchedulerExtenderConfig`: how the extender scores (`rdmaplane scheduler-extender --config`,
`rdmaplane explain-placement --config`; docs/scheduler-extender.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from rdmaplane.config.base import Kind, Section
from rdmaplane.config.resources import ResourcesConfig
from rdmaplane.fabric import DEFAULT_LABEL_SCHEMES
from rdmaplane.scheduler import jobaware as ja
from rdmaplane.scheduler import placement as pl

_W = pl.Weights()


class WeightsConfig(Section):
    """Score = 10 x (alignment x A + packing x P) / (alignment + packing)."""

    alignment: float = Field(default=_W.alignment, ge=0, description="the alignment term A ...")
    packing: float = Field(default=_W.packing, ge=0, description="... against the packing term P")
    pcie: float = Field(
        default=_W.pcie, ge=0, description="A: a GPU with a free NIC on its PCIe root"
    )
    numa: float = Field(default=_W.numa, ge=0, description="A: ... on its NUMA zone only")
    cross: float = Field(default=_W.cross, ge=0, description="A: ... only across NUMA zones")
    not_preferred: float = Field(
        default=_W.not_preferred,
        ge=0,
        le=1,
        description="A x this when the kubelet does not promise NUMA alignment",
    )
    zone_fill: float = Field(
        default=_W.zone_fill, ge=0, description="P: how full the touched zones end up"
    )
    node_fill: float = Field(default=_W.node_fill, ge=0, description="P: how full the node ends up")

    @model_validator(mode="after")
    def _some_weight(self) -> WeightsConfig:
        """Weights that make every node score the same are a mistake, not a policy."""
        if self.alignment + self.packing == 0:
            raise ValueError("alignment and packing are both 0: every node would score 0")
        if self.alignment > 0 and max(self.pcie, self.numa, self.cross) == 0:
            raise ValueError("pcie, numa and cross are all 0: the alignment term would be 0")
        if self.packing > 0 and self.zone_fill + self.node_fill == 0:
            raise ValueError("zoneFill and nodeFill are both 0: the packing term would be 0")
        return self


class FabricConfig(Section):
    """Job-aware scoring (docs/fabric.md): the fabric term weighed against the node-local score,
    and the node label schemes that say where a node sits (each closest tier first)."""

    weight: float = Field(default=ja.FabricWeights.fabric, ge=0, description="the fabric term")
    node_local: float = Field(
        default=ja.FabricWeights.node, ge=0, description="... against the node-local score"
    )
    tier_labels: list[list[str]] = Field(
        default_factory=lambda: [list(s) for s in DEFAULT_LABEL_SCHEMES],
        min_length=1,
        description="label schemes, each closest tier first; a node takes the one it has most of",
    )

    def weights(self) -> ja.FabricWeights:
        return ja.FabricWeights(self.weight, self.node_local)


class SchedulerExtenderConfig(Kind):
    """The extender's scoring weights, resource names and limits."""

    docs = "docs/scheduler-extender.md"
    read_by = "rdmaplane scheduler-extender --config and rdmaplane explain-placement --config"

    kind: Literal["SchedulerExtenderConfig"] = "SchedulerExtenderConfig"
    weights: WeightsConfig = Field(default_factory=WeightsConfig, description="scoring")
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig, description="names")
    max_request_bytes: int = Field(
        default=16 * 1024 * 1024, gt=0, description="larger request bodies get 413"
    )
    memo_entries: int = Field(
        default=200_000, gt=0, description="cached decisions (node state, request)"
    )
    fabric: FabricConfig = Field(default_factory=FabricConfig, description="job-aware scoring")

    def policy(self) -> pl.Policy:
        w = self.weights
        return pl.Policy(
            pl.Weights(
                w.alignment,
                w.packing,
                w.pcie,
                w.numa,
                w.cross,
                w.not_preferred,
                w.zone_fill,
                w.node_fill,
            ),
            self.resources.vocabulary(),
        )
