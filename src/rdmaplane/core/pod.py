"""The one Pod model: what rdmaplane reads of a v1 Pod, and how it counts extended resources.

Pure. The scheduler extender (`services.scheduler.policy.request`) and the admission webhook
(`services.webhook.policy.podview`, which adds the fields only it reads) both read pods through
it, so a device is counted by one rule: the API server's for extended resources (a name with a
domain other than kubernetes.io: `nvidia.com/gpu`, `rdmaplane.io/hca`), upstream
`ValidateResourceRequirements` and the defaulting of requests from limits:

- a quantity must be a whole, non-negative number (`must be an integer`): anything else is
  refused when the pod is read, and the error names the field;
- a limit alone: the request defaults to the limit;
- a request and a limit: they must be equal (`must be equal to ... limit`);
- a request without a limit: refused (`Limit must be set for non overcommitable resources`).

So a container's count of a resource is its limit (0 too: naming a resource matters to the
kubelet). The last two rules are kept as facts (`Resources.faults`), not raised: the webhook is
called before the API server validates and says so in a warning, the extender refuses the pod
as the API server would; each caller decides on the same facts.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

import msgspec

from rdmaplane.core.decoding import parse_quantity
from rdmaplane.core.resources import is_extended

# The kubelet's kinds of container, in the order it starts them: regular init containers and
# sidecars (init containers with `restartPolicy: Always`) as listed, then the app containers.
KINDS: Final = ("init", "sidecar", "app")


def parse_count(value: Any) -> int:
    """A device count: a whole, non-negative Kubernetes quantity ("2", 2, "1k"); `ValueError`
    otherwise (the API server refuses such a quantity of an extended resource)."""
    if type(value) is str and value.isascii() and value.isdigit():
        return int(value)  # the form nearly every pod uses, read without a Decimal
    quantity = parse_quantity(value)
    if quantity is None or quantity < 0 or quantity != quantity.to_integral_value():
        raise ValueError(f"expected a whole number of devices, got {value!r}")
    return int(quantity)


class ResourceList(dict[str, int]):
    """A container's `limits` or `requests`: the count of each extended resource it names (0
    too), whole and non-negative; the other resources (cpu, memory) are no devices and are
    kept as written in `other`, never counted here."""

    __slots__ = ("other",)
    expected = "an object"
    other: Mapping[str, Any]

    @classmethod
    def of(cls, counts: Mapping[str, int], other: Mapping[str, Any] | None = None) -> ResourceList:
        made = cls(counts)
        made.other = other or {}
        return made

    @classmethod
    def from_wire(cls, value: Any) -> ResourceList:
        if not isinstance(value, dict):
            raise ValueError("expected an object")
        made = cls()
        other: dict[str, Any] = {}
        for name, amount in value.items():
            if not isinstance(name, str):
                continue
            if not is_extended(name):
                other[name] = amount
                continue
            try:
                made[name] = parse_count(amount)
            except ValueError as e:
                raise ValueError(f"[{name}]: {e}") from None
        made.other = other
        return made


_NONE: Final = ResourceList.of({})


class Resources(msgspec.Struct, frozen=True):
    """A container's resource requirements, and its device counts by the API server's rule."""

    limits: ResourceList | None = None
    requests: ResourceList | None = None

    @property
    def devices(self) -> Mapping[str, int]:
        """The count of each extended resource the container names with a limit (0 too):
        the limit, which the request equals or defaults to."""
        return self.limits or _NONE

    def count(self, name: str) -> int:
        """The container's count of resource `name`: its limit; 0 when it has none."""
        return (self.limits or _NONE).get(name, 0)

    @property
    def names(self) -> set[str]:
        """Every extended resource named in limits or requests."""
        return {*(self.limits or ()), *(self.requests or ())}

    @property
    def unlimited(self) -> tuple[str, ...]:
        """Extended resources requested without a limit (the API server refuses the pod)."""
        limits = self.limits or _NONE
        return tuple(sorted(n for n in self.requests or () if n not in limits))

    @property
    def mismatched(self) -> tuple[str, ...]:
        """Extended resources whose request differs from their limit (refused too)."""
        limits, requests = self.limits or _NONE, self.requests or _NONE
        return tuple(sorted(n for n, k in requests.items() if n in limits and limits[n] != k))

    def faults(self) -> Iterator[tuple[str, str]]:
        """(field below `resources`, why) for each request the API server refuses."""
        limits, requests = self.limits or _NONE, self.requests or _NONE
        if all(limits.get(name) == count for name, count in requests.items()):
            return  # nearly every pod: no request, or the limits again
        for name in self.mismatched:
            yield (
                f"requests[{name}]",
                f"{requests[name]} is not the limit {limits[name]} (the API server refuses an "
                "extended resource whose request differs from its limit)",
            )
        for name in self.unlimited:
            yield (
                f"requests[{name}]",
                "a request without a limit (the API server refuses an extended resource "
                "without a limit; set limits, the request defaults to them)",
            )


_NO_RESOURCES: Final = Resources()


class Container(msgspec.Struct, frozen=True, rename="camel"):
    """A container (or init container) as every reader needs it; the webhook's adds the
    fields only it reads."""

    name: str = ""
    resources: Resources | None = None
    restart_policy: str | None = None  # "Always" makes an init container a sidecar

    @property
    def requirements(self) -> Resources:
        return self.resources or _NO_RESOURCES


class SchedulingGroup(msgspec.Struct, frozen=True, rename="camel"):
    pod_group_name: str | None = None  # the PodGroup (scheduling.k8s.io) of a gang


class PodSpec(msgspec.Struct, frozen=True, rename="camel"):
    containers: tuple[Container, ...] | None = None
    init_containers: tuple[Container, ...] | None = None
    node_name: str | None = None
    scheduling_group: SchedulingGroup | None = None

    def every(self) -> Iterator[tuple[str, int, Container]]:
        """(field, index, container): init containers first, as the kubelet starts them."""
        for i, c in enumerate(self.init_containers or ()):
            yield "initContainers", i, c
        for i, c in enumerate(self.containers or ()):
            yield "containers", i, c

    def faults(self) -> Iterator[tuple[str, str]]:
        """(field, why) for each extended-resource request the API server refuses, the field
        named from the pod (`spec.containers[0].resources.requests[nvidia.com/gpu]`)."""
        for field, i, c in self.every():
            for below, why in c.requirements.faults():
                yield f"spec.{field}[{i}].resources.{below}", why


class ObjectMeta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    creation_timestamp: str | None = None
    resource_version: str | None = None  # where a watch resumes


class PodStatus(msgspec.Struct, frozen=True):
    phase: str | None = None


class Pod(msgspec.Struct, frozen=True):
    """A v1 Pod as rdmaplane reads it: who it is, what each container asks for, where it is
    bound; every other field is skipped when decoding."""

    metadata: ObjectMeta = ObjectMeta()
    spec: PodSpec | None = None
    status: PodStatus | None = None

    @property
    def key(self) -> str:
        """namespace/name"""
        return f"{self.metadata.namespace or 'default'}/{self.metadata.name}"

    @property
    def annotations(self) -> Mapping[str, str]:
        return self.metadata.annotations or {}
