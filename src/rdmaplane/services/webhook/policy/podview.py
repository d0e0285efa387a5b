"""What the admission webhook reads of a Pod: the one Pod model (`rdmaplane.core.pod`: its
containers, their extended resources counted by the API server's rule) and the fields only the
webhook reads beside it: volumes, mounts, environment, security context, node selector. Pure.

Read through the model layer (`rdmaplane.core.decoding`): the pod as it arrived, and the patch
builder's working copy where the patch so far matters (volumes, the doctor).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import msgspec

from rdmaplane.core.decoding import convert
from rdmaplane.core.pod import Container, Pod, PodSpec


class FieldRef(msgspec.Struct, frozen=True, rename="camel"):
    field_path: str | None = None


class DownwardItem(msgspec.Struct, frozen=True, rename="camel"):
    field_ref: FieldRef | None = None


class DownwardAPI(msgspec.Struct, frozen=True):
    items: tuple[DownwardItem, ...] | None = None


class Projection(msgspec.Struct, frozen=True, rename={"downward_api": "downwardAPI"}):
    downward_api: DownwardAPI | None = None


class Projected(msgspec.Struct, frozen=True):
    sources: tuple[Projection, ...] | None = None


class HostPath(msgspec.Struct, frozen=True):
    path: str = ""


class Volume(
    msgspec.Struct, frozen=True, rename={"downward_api": "downwardAPI", "host_path": "hostPath"}
):
    name: str = ""
    downward_api: DownwardAPI | None = None
    projected: Projected | None = None
    host_path: HostPath | None = None

    @property
    def shows_annotations(self) -> bool:
        """It shows `metadata.annotations` as a file (downwardAPI, or projected)."""
        sources = [self.downward_api]
        if self.projected is not None:
            sources += [s.downward_api for s in self.projected.sources or ()]
        return any(
            item.field_ref is not None and item.field_ref.field_path == "metadata.annotations"
            for source in sources
            if source is not None
            for item in source.items or ()
        )


class VolumeMount(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    mount_path: str = ""


class EnvVar(msgspec.Struct, frozen=True):
    name: str = ""
    value: str | None = None  # None: set from a reference (valueFrom)


class Capabilities(msgspec.Struct, frozen=True):
    add: tuple[str, ...] | None = None


class SecurityContext(msgspec.Struct, frozen=True):
    privileged: bool | None = None
    capabilities: Capabilities | None = None


class ContainerView(Container, frozen=True):
    """A container as the webhook reads it: the model's (name, resources) and what it adds."""

    env: tuple[EnvVar, ...] | None = None
    security_context: SecurityContext | None = None
    volume_mounts: tuple[VolumeMount, ...] | None = None

    def mounts_at(self, path: str) -> bool:
        want = path.rstrip("/")
        return any(m.mount_path.rstrip("/") == want for m in self.volume_mounts or ())

    @property
    def privileged(self) -> bool:
        return self.security_context is not None and self.security_context.privileged is True


class SpecView(PodSpec, frozen=True):
    containers: tuple[ContainerView, ...] | None = None
    init_containers: tuple[ContainerView, ...] | None = None
    volumes: tuple[Volume, ...] | None = None
    node_selector: dict[str, str] | None = None

    def every(self) -> Iterator[tuple[str, int, ContainerView]]:
        """(field, index, container): init containers first, as the kubelet starts them."""
        for field, index, container in super().every():
            assert isinstance(container, ContainerView)
            yield field, index, container


class PodView(Pod, frozen=True):
    spec: SpecView | None = None


def read_pod(pod: Any) -> PodView:
    """`pod` (decoded JSON) as the webhook reads it; `DecodeError` names a bad field."""
    return convert(pod, PodView)


def read_spec(spec: Any) -> SpecView:
    """A spec (the patch builder's working copy of it) as the webhook reads it."""
    return convert(spec, SpecView)


def memory_limit(container: ContainerView) -> Any:
    """The container's memory limit as written (a quantity), or None."""
    limits = container.requirements.limits
    return None if limits is None else limits.other.get("memory")
