"""What the webhook does for DRA: pods that get their devices through `spec.resourceClaims`,
and GPU pods headed to a DRA node pool.

Pure, on the pod as the API server sent it (a dict) and the webhook's `Dra` settings:

- a pod that already has claims is a DRA pod: it is never given device-plugin resources (it
  would ask for its NICs twice); its containers that use a claim get IPC_LOCK, `/dev/shm` and
  the fault notice like GPU containers (`inject.mutate` adds them);
- a GPU pod headed to a DRA pool (its nodeSelector or required node affinity pins the pool's
  labels, or its namespace is the pool's: `DraNodePool`) gets, per GPU container, a claim from the
  pool's template for that many GPUs, pairing each GPU with a NIC port on its PCIe root, in
  place of its `nvidia.com/gpu` count (which moves into the claim: the one thing the webhook
  removes, or the pod would ask for its GPUs twice). The NCCL/UCX environment of exactly the
  claimed NICs comes from the DRA driver's CDI edits, as for any DRA pod (docs/dra.md);
- a GPU count no template serves keeps the device-plugin path (`rdmaplane.io/hca`), which a
  DRA node serves through the DeviceClass's `extendedResourceName` (KEP-5004), without
  pairing; the warning says so.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Protocol

from rdmaplane.core.settings.webhook import Dra, DraNodePool

Json = Any
Path = tuple[str | int, ...]


class Builder(Protocol):
    """`inject`'s patch builder: operations against a working copy that follows them."""

    obj: dict[str, Json]

    def insert(self, path: Path, item: Json, index: int | None = None) -> None: ...

    def remove(self, path: Path) -> None: ...


def _dict(value: Json) -> dict[str, Json]:
    return value if isinstance(value, dict) else {}


def _list(value: Json) -> list[Json]:
    return value if isinstance(value, list) else []


def claims(pod: Mapping[str, Json]) -> list[str]:
    """The names of the pod's `spec.resourceClaims` (empty: not a DRA pod)."""
    listed = _list(_dict(pod.get("spec")).get("resourceClaims"))
    return [str(c.get("name", "")) for c in listed if isinstance(c, dict)]


def container_claims(container: Mapping[str, Json]) -> list[str]:
    """The claims a container uses (`resources.claims[].name`)."""
    listed = _list(_dict(container.get("resources")).get("claims"))
    return [str(c.get("name", "")) for c in listed if isinstance(c, dict)]


def claim_users(pod: Mapping[str, Json]) -> Iterator[tuple[str, int]]:
    """(field, index) of every container and init container that uses one of the pod's
    claims."""
    named = set(claims(pod))
    spec = _dict(pod.get("spec"))
    for field in ("initContainers", "containers"):
        for i, c in enumerate(_list(spec.get(field))):
            if isinstance(c, dict) and named & set(container_claims(c)):
                yield field, i


def headed_to(pod: Mapping[str, Json], namespace: str | None, dra: Dra) -> DraNodePool | None:
    """The first DRA pool the pod is headed to, by what the pod or the cluster's admin says:
    its nodeSelector holds the pool's labels; or every term of its required node affinity
    asks `In` exactly the pool's value for each of them; or its namespace is one of the pool's.
    None: not headed to one (or `dra.enabled` is off)."""
    if not dra.enabled:
        return None
    spec = _dict(pod.get("spec"))
    selector = _dict(spec.get("nodeSelector"))
    ns = namespace or _dict(pod.get("metadata")).get("namespace")
    for pool in dra.pools:
        wanted = pool.node_selector
        if wanted and all(selector.get(k) == v for k, v in wanted.items()):
            return pool
        if wanted and _affinity_pins(spec, wanted):
            return pool
        if ns in pool.namespaces:
            return pool
    return None


def _affinity_pins(spec: Mapping[str, Json], wanted: Mapping[str, str]) -> bool:
    """Every required node-affinity term holds `key In [value]` (that value only) for every
    label of `wanted`: the pod can land on no node without those labels."""
    required = _dict(
        _dict(_dict(spec.get("affinity")).get("nodeAffinity")).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
    )
    terms = [t for t in _list(required.get("nodeSelectorTerms")) if isinstance(t, dict)]

    def pins(term: Mapping[str, Json], key: str, value: str) -> bool:
        return any(
            isinstance(e, dict)
            and e.get("key") == key
            and e.get("operator") == "In"
            and _list(e.get("values")) == [value]
            for e in _list(term.get("matchExpressions"))
        )

    return bool(terms) and all(pins(t, k, v) for t in terms for k, v in wanted.items())


def give_claim(
    build: Builder, at: Path, gpus: Mapping[str, int], pool: DraNodePool, dra: Dra
) -> str | None:
    """Move the container's GPU count into a claim made from the pool's template for that
    many GPUs: remove the GPU resource from its limits (and requests), add the claim to
    `spec.resourceClaims` and its name to the container's `resources.claims`. Returns the
    template's name; None (nothing done) when the container asks other GPUs than `dra.gpu`
    or no template has its count."""
    if set(gpus) != {dra.gpu}:
        return None
    template = pool.template(gpus[dra.gpu])
    if template is None:
        return None
    container = _dict(_at(build.obj, at))
    resources = _dict(container.get("resources"))
    for table in ("limits", "requests"):
        if dra.gpu in _dict(resources.get(table)):
            build.remove((*at, "resources", table, dra.gpu))
    name = _free_name(dra.claim_name, claims(build.obj))
    build.insert(("spec", "resourceClaims"), {"name": name, "resourceClaimTemplateName": template})
    build.insert((*at, "resources", "claims"), {"name": name})
    return template


def not_served(gpus: int, pool: DraNodePool, dra: Dra, mode: str, resource: str) -> str:
    """The warning for a container on a DRA pool that keeps the device-plugin path, given
    `resource` (the HCA pool of `mode`)."""
    if mode == "shared":
        return (
            f"headed to DRA pool {pool.name} in shared mode: given {resource}, which no "
            "DeviceClass serves on DRA nodes (only rdmaplane.io/hca is), so it fits no node "
            "there; name a share template (deploy/dra/share-templates.yaml) in its "
            "resourceClaims, or use exclusive mode"
        )
    sizes = ", ".join(str(t.gpus) for t in pool.claim_templates) or "none"
    return (
        f"headed to DRA pool {pool.name} but no claim template of it has {gpus} {dra.gpu} "
        f"(it has: {sizes}): given {resource} as on the device-plugin path, which the pool "
        "serves through its DeviceClasses' extendedResourceName, with no GPU-NIC pairing"
    )


def doctor_claims(build: Builder, at: Path) -> list[str]:
    """The claims of the container at `at` as the patch so far leaves it: the doctor init
    container shares them (containers of one pod may share a claim's devices)."""
    return container_claims(_dict(_at(build.obj, at)))


def _at(obj: Json, path: Sequence[str | int]) -> Json:
    for token in path:
        if isinstance(obj, list) and isinstance(token, int):
            obj = obj[token] if token < len(obj) else None
        else:
            obj = _dict(obj).get(str(token))
    return obj


def _free_name(base: str, taken: Sequence[str]) -> str:
    name, n = base, 1
    while name in taken:
        n += 1
        name = f"{base}-{n}"
    return name
