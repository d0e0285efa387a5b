"""Pods on the real node: bodies with the defaults every node test wants, and waiting for them."""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from lightkube import ApiError, AsyncClient
from lightkube.resources.core_v1 import Pod

from tests.node.realnode import BUSYBOX, NODE_NAME

WAIT_S = 120.0  # generous: the machine is shared; a pod is Running in ~1 s when it is idle


def pod_body(
    name: str,
    command: Sequence[str],
    *,
    image: str = BUSYBOX,
    limits: Mapping[str, str | int] | None = None,
    node: str = NODE_NAME,
    **spec: Any,
) -> dict[str, Any]:
    """One container `c` running `command` on `node` (through the scheduler), with the
    extended resources in `limits`; no service-account token (the pods need no API access),
    a 1 s grace period; `spec` adds to or replaces the pod spec's fields."""
    container: dict[str, Any] = {
        "name": "c",
        "image": image,
        "imagePullPolicy": "Never",
        "command": list(command),
    }
    if limits:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [container],
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "nodeSelector": {"kubernetes.io/hostname": node},
            **spec,
        },
    }


async def create(kube: AsyncClient, namespace: str, body: Mapping[str, Any]) -> str:
    pod = Pod.from_dict({**body, "metadata": {**body["metadata"], "namespace": namespace}})
    created = await kube.create(pod)
    assert created.metadata is not None and created.metadata.name is not None
    return created.metadata.name


def phase(pod: Pod) -> str:
    return (pod.status.phase if pod.status else None) or "Pending"


async def wait_phase(
    kube: AsyncClient, namespace: str, name: str, phases: Sequence[str], within: float = WAIT_S
) -> Pod:
    """The pod once its phase is one of `phases`; `AssertionError` with its status after
    `within` s, or when it ends in another phase."""
    deadline = time.monotonic() + within
    while True:
        pod = await kube.get(Pod, name, namespace=namespace)
        if phase(pod) in phases:
            return pod
        if phase(pod) in ("Succeeded", "Failed") or time.monotonic() > deadline:
            raise AssertionError(f"pod {namespace}/{name} is {phase(pod)}: {pod.status}")
        await asyncio.sleep(0.1)


async def log(
    kube: AsyncClient, namespace: str, name: str, container: str = "c", timestamps: bool = False
) -> str:
    """The container's log through the API server, which asks the kubelet for it."""
    lines = [
        line
        async for line in kube.log(
            name, namespace=namespace, container=container, timestamps=timestamps
        )
    ]
    return "".join(lines)


async def gone(kube: AsyncClient, namespace: str, name: str, within: float = WAIT_S) -> None:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            await kube.get(Pod, name, namespace=namespace)
        except ApiError as e:
            if e.status.code == 404:
                return
            raise
        await asyncio.sleep(0.1)
    raise AssertionError(f"pod {namespace}/{name} still there after {within} s")


def env_lines(text: str) -> dict[str, str]:
    """`env` output as a mapping (lines without `=` are not env)."""
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


async def until(
    check: Callable[[], Any], what: str, within: float = WAIT_S, every: float = 0.05
) -> Any:
    """`check()`'s first truthy result (awaited when it is a coroutine), polled every `every`
    s; AssertionError naming `what` after `within` s."""
    deadline = time.monotonic() + within
    while True:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return result
        assert time.monotonic() < deadline, f"{what}: not within {within:.0f} s"
        await asyncio.sleep(every)
