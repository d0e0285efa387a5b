"""The extender's configuration file (YAML or JSON), validated with errors that name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rdmaplane.documents import DocumentError, expect_mapping, read_document
from rdmaplane.fabric import DEFAULT_LABEL_SCHEMES
from rdmaplane.scheduler import jobaware as ja
from rdmaplane.scheduler import placement as pl

_W = pl.Weights()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


class WeightsConfig(_Model):
    """Score = 10 x (alignment x A + packing x P) / (alignment + packing)."""

    alignment: float = Field(_W.alignment, ge=0)
    packing: float = Field(_W.packing, ge=0)
    pcie: float = Field(_W.pcie, ge=0, description="a GPU paired with a NIC on its PCIe root")
    numa: float = Field(_W.numa, ge=0, description="a GPU with a NIC on its NUMA zone only")
    cross: float = Field(_W.cross, ge=0, description="a GPU whose NIC is across NUMA zones")
    not_preferred: float = Field(_W.not_preferred, ge=0, le=1, alias="notPreferred")
    zone_fill: float = Field(_W.zone_fill, ge=0, alias="zoneFill")
    node_fill: float = Field(_W.node_fill, ge=0, alias="nodeFill")


class ResourcesConfig(_Model):
    gpu: str = pl.ResourceNames.gpu
    hca: str = pl.ResourceNames.hca
    hca_shared: str = Field(pl.ResourceNames.hca_shared, alias="hcaShared")


class FabricConfig(_Model):
    """Job-aware scoring (docs/fabric.md): the fabric term weighed against the node-local score,
    and the node label schemes that say where a node sits (each closest tier first)."""

    weight: float = Field(ja.FabricWeights.fabric, ge=0, description="the fabric term")
    node_local: float = Field(ja.FabricWeights.node, ge=0, alias="nodeLocal")
    tier_labels: list[list[str]] = Field(
        default_factory=lambda: [list(s) for s in DEFAULT_LABEL_SCHEMES],
        alias="tierLabels",
        min_length=1,
    )

    def weights(self) -> ja.FabricWeights:
        return ja.FabricWeights(self.weight, self.node_local)


class ExtenderConfig(_Model):
    api_version: Literal["rdmaplane.io/v1alpha1"] = Field(
        "rdmaplane.io/v1alpha1", alias="apiVersion"
    )
    kind: Literal["SchedulerExtenderConfig"] = "SchedulerExtenderConfig"
    weights: WeightsConfig = Field(default_factory=lambda: WeightsConfig.model_validate({}))
    resources: ResourcesConfig = Field(default_factory=lambda: ResourcesConfig.model_validate({}))
    max_request_bytes: int = Field(16 * 1024 * 1024, gt=0, alias="maxRequestBytes")
    memo_entries: int = Field(200_000, gt=0, alias="memoEntries")
    fabric: FabricConfig = Field(default_factory=lambda: FabricConfig.model_validate({}))

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
            pl.ResourceNames(self.resources.gpu, self.resources.hca, self.resources.hca_shared),
        )


class ConfigError(ValueError):
    pass


def load_config(path: Path | None) -> ExtenderConfig:
    """Read the file (or the defaults when `path` is None); `ConfigError` names file and key."""
    if path is None:
        return ExtenderConfig.model_validate({})
    try:
        data = expect_mapping(read_document(path), str(path))
    except DocumentError as exc:
        raise ConfigError(str(exc)) from None
    try:
        return ExtenderConfig.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        key = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ConfigError(f"{path}: {key}: {first['msg']}") from exc
