"""A pod's devices as the scheduler and the kubelet count them: per container in the kubelet's
order, and the pod's effective request. Pure.

Read from the one Pod model (`rdmaplane.core.pod`, the API server's counting rule); a pod the
API server would refuse (a non-whole count, a request without a limit or different from it) is
refused here too, as a `RequestError` naming the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rdmaplane.core.decoding import DecodeError, convert
from rdmaplane.core.errors import InputError
from rdmaplane.core.pod import Container, Pod
from rdmaplane.core.resources import NONE, Amounts, Vocabulary


class RequestError(InputError):
    """A pod whose requests cannot be read; the message names the field."""


@dataclass(frozen=True, slots=True)
class ContainerRequest:
    """One container's devices by resource name: a regular init container, a sidecar (an init
    container with `restartPolicy: Always`) or an app container (`rdmaplane.core.pod.KINDS`)."""

    kind: str
    devices: Amounts
    zero: tuple[str, ...] = ()  # resources its limits name with a count of 0 (see kubelet_hint)


@dataclass(frozen=True, slots=True)
class PodRequest:
    """Extended-resource requests of a pod, as the scheduler and the kubelet count them. Read
    without a vocabulary (a pod is one request on every node); `on` keeps what a node's
    vocabulary names."""

    steps: tuple[ContainerRequest, ...]  # containers naming devices, in the kubelet's order
    total: Amounts  # the effective pod request (max of the app sum and each init container)
    zero: tuple[str, ...] = ()  # resources named by some container, 0 in total

    @classmethod
    def of(cls, *devices: Mapping[str, int]) -> PodRequest:
        """A pod of app containers only."""
        units = [Amounts(d) for d in devices]
        steps = tuple(ContainerRequest("app", unit) for unit in units if unit)
        total = NONE
        for unit in units:
            total = total + unit
        return cls(steps, total)

    @property
    def containers(self) -> tuple[Amounts, ...]:
        """Devices of the containers that run alongside each other: sidecars and apps."""
        return tuple(step.devices for step in self.steps if step.kind != "init")

    @property
    def init(self) -> tuple[Amounts, ...]:
        return tuple(step.devices for step in self.steps if step.kind == "init")

    @property
    def wants_devices(self) -> bool:
        return bool(self.total)

    def on(self, vocabulary: Vocabulary) -> PodRequest:
        """The request as a node with `vocabulary` sees it: the resources it names alone
        (others are not devices there; kube-scheduler's own fit checks count them)."""
        known = vocabulary.kind
        if all(known(n) for n in self.total) and all(known(n) for n in self.zero):
            return self
        names = vocabulary.names
        steps = []
        for step in self.steps:
            devices, zero = step.devices.only(names), tuple(n for n in step.zero if known(n))
            if devices or zero:
                steps.append(ContainerRequest(step.kind, devices, zero))
        return PodRequest(
            tuple(steps), self.total.only(names), tuple(n for n in self.zero if known(n))
        )


def read_pod(obj: Pod | Mapping[str, Any]) -> Pod:
    """A Pod object (decoded JSON/YAML) through the model; `RequestError` names the field."""
    if isinstance(obj, Pod):
        return obj
    try:
        return convert(obj, Pod, "Pod")
    except DecodeError as e:
        raise RequestError(str(e)) from None


def pod_request(pod: Pod | Mapping[str, Any]) -> PodRequest:
    """The extended-resource requests of a Pod (each container's limits, which its requests
    equal), in the order the kubelet admits containers: init containers and sidecars as
    listed, then apps. A request the API server refuses is refused here."""
    spec = read_pod(pod).spec
    if spec is None:
        raise RequestError("Pod.spec: expected an object")
    steps: list[ContainerRequest] = []
    sidecars = total = NONE
    named: set[str] = set()
    for index, container in enumerate(spec.init_containers or ()):
        devices, names_here = _container_devices(container, "initContainers", index)
        kind = "sidecar" if container.restart_policy == "Always" else "init"
        zero = tuple(name for name in names_here if not devices[name])
        steps.append(ContainerRequest(kind, devices, zero))
        named.update(names_here)
        if kind == "sidecar":
            sidecars = sidecars + devices
        else:
            total = total | (devices + sidecars)
    apps = sidecars
    for index, container in enumerate(spec.containers or ()):
        devices, names_here = _container_devices(container, "containers", index)
        zero = tuple(name for name in names_here if not devices[name])
        steps.append(ContainerRequest("app", devices, zero))
        named.update(names_here)
        apps = apps + devices
    total = total | apps
    return PodRequest(
        tuple(step for step in steps if step.devices or step.zero),
        total,
        tuple(name for name in sorted(named) if not total[name]),
    )


def _container_devices(
    container: Container, field: str, index: int
) -> tuple[Amounts, tuple[str, ...]]:
    """The container's extended resources, and which of them it names at all (0 too)."""
    resources = container.resources
    if resources is None:
        return NONE, ()
    if resources.requests:  # most pods' requests are their limits again: no fault to find
        for below, why in resources.faults():
            raise RequestError(f"Pod.spec.{field}[{index}].resources.{below}: {why}")
    devices = resources.devices
    return Amounts(devices), tuple(sorted(devices))
