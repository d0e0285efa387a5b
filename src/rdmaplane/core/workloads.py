"""Where each kind of workload keeps its pod templates: one table (`WORKLOADS`) for every reader of
manifests (`rdmaplane inject` and the webhook's rules it previews, `explain-placement`, the Job
`doctor job` writes, the examples' tests). Pure: objects in, templates out.

A kind is named by its API group and kind (`batch/Job` is not Volcano's `batch.volcano.sh/Job`);
a path is the keys from the object down to a pod template (`metadata` + `spec`), `*` standing
for every item of a list or every value of a map (JobSet's `replicatedJobs`, PyTorchJob's
`pytorchReplicaSpecs`). A Pod is its own template (the empty path). The table also names the
label each job controller puts on its pods (`batch.kubernetes.io/job-name`, ...): the pods an
explanation stands for carry it, as the real ones will.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

from rdmaplane.core.jsonpatch import Path, pointer
from rdmaplane.core.untrusted import DocumentError


@dataclass(frozen=True, slots=True)
class Workload:
    """Where a kind keeps its pod templates, and the label its controller gives each pod
    naming the workload (what job-aware scoring groups pods by)."""

    paths: tuple[tuple[str, ...], ...]
    group_label: str | None = None


_APPS = (("spec", "template"),)
_KUBEFLOW_LABEL = "training.kubeflow.org/job-name"


def _kubeflow(field: str) -> Workload:
    return Workload((("spec", field, "*", "template"),), _KUBEFLOW_LABEL)


WORKLOADS: Final[Mapping[str, Workload]] = {
    "Pod": Workload(((),)),
    "PodTemplate": Workload((("template",),)),
    "ReplicationController": Workload(_APPS),
    "apps/Deployment": Workload(_APPS),
    "apps/ReplicaSet": Workload(_APPS),
    "apps/StatefulSet": Workload(_APPS),
    "apps/DaemonSet": Workload(_APPS),
    "batch/Job": Workload(_APPS, "batch.kubernetes.io/job-name"),
    "batch/CronJob": Workload((("spec", "jobTemplate", "spec", "template"),)),
    "jobset.x-k8s.io/JobSet": Workload(
        (("spec", "replicatedJobs", "*", "template", "spec", "template"),),
        "jobset.sigs.k8s.io/jobset-name",
    ),
    "leaderworkerset.x-k8s.io/LeaderWorkerSet": Workload(
        (
            ("spec", "leaderWorkerTemplate", "leaderTemplate"),
            ("spec", "leaderWorkerTemplate", "workerTemplate"),
        ),  # its pods' group is a replica (name + group-index), unknown before they exist
    ),
    "batch.volcano.sh/Job": Workload((("spec", "tasks", "*", "template"),), "volcano.sh/job-name"),
    "kubeflow.org/PyTorchJob": _kubeflow("pytorchReplicaSpecs"),
    "kubeflow.org/TFJob": _kubeflow("tfReplicaSpecs"),
    "kubeflow.org/MPIJob": _kubeflow("mpiReplicaSpecs"),
    "kubeflow.org/XGBoostJob": _kubeflow("xgbReplicaSpecs"),
    "kubeflow.org/PaddleJob": _kubeflow("paddleReplicaSpecs"),
    "kubeflow.org/JAXJob": _kubeflow("jaxReplicaSpecs"),
}


# Kinds whose pods rdmaplane does not read (their templates are not a pod template at a fixed
# path, or the operator builds the pods from its own fields): `group/Kind` → where their pods'
# containers are, as a warning names it. A manifest of one that asks GPUs is said on `inject`,
# `explain-placement` (and, later, in the webhook's warnings): its pods reach the webhook and
# the extender only when they are created, and nothing here previews them.
UNREAD_WORKLOADS: Final[Mapping[str, str]] = {
    "ray.io/RayCluster": "spec.headGroupSpec.template, spec.workerGroupSpecs[*].template",
    "ray.io/RayJob": "spec.rayClusterSpec",
    "ray.io/RayService": "spec.rayClusterConfig",
    "serving.kserve.io/InferenceService": "spec.predictor (and transformer, explainer)",
    "serving.kserve.io/ServingRuntime": "spec.containers",
    "serving.kserve.io/ClusterServingRuntime": "spec.containers",
    "serving.kserve.io/InferenceGraph": "spec.nodes",
    "serving.knative.dev/Service": "spec.template",
    "argoproj.io/Workflow": "spec.templates[*].container, script, containerSet",
    "argoproj.io/WorkflowTemplate": "spec.templates[*].container, script, containerSet",
    "argoproj.io/ClusterWorkflowTemplate": "spec.templates[*].container, script, containerSet",
    "argoproj.io/CronWorkflow": "spec.workflowSpec.templates[*]",
    "argoproj.io/Rollout": "spec.template",
    "kubeflow.org/Notebook": "spec.template.spec",
    "kubeflow.org/MXJob": "spec.mxReplicaSpecs[*].template",
    "trainer.kubeflow.org/TrainJob": "spec.trainer (pods built from its runtime)",
    "trainer.kubeflow.org/TrainingRuntime": "spec.template (a JobSet)",
    "trainer.kubeflow.org/ClusterTrainingRuntime": "spec.template (a JobSet)",
    "workload.codeflare.dev/AppWrapper": "spec.components[*].template",
    "apps.nvidia.com/NIMService": "spec (the operator builds its pods)",
    "serving.volcano.sh/ModelServing": "spec.template",
    "grove.io/PodCliqueSet": "spec.template.cliques[*].spec.podSpec",
}


def asks_for(obj: object, resources: Iterable[str]) -> bool:
    """Whether any `limits` or `requests` anywhere in `obj` names one of `resources` (how a
    kind the table does not know shows that its pods ask GPUs). Iterative, each container
    once."""
    names = frozenset(resources)
    seen: set[int] = set()
    stack = [obj]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Mapping):
            for key in ("limits", "requests"):
                asked = node.get(key)
                if isinstance(asked, Mapping) and names.intersection(asked):
                    return True
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def unread_gpu_workloads(
    objects: Iterable[tuple[str, object]], gpu_resources: Iterable[str]
) -> list[str]:
    """A warning for each object of a manifest (`documents.manifest_objects`) that asks GPUs
    but is not a kind whose pod templates the table knows: named by kind, namespace and name,
    with where such a kind keeps its pods when `UNREAD_WORKLOADS` knows it."""
    gpus = tuple(gpu_resources)
    found: list[str] = []
    for where, obj in objects:
        if not isinstance(obj, Mapping) or is_workload(obj) or not asks_for(obj, gpus):
            continue
        pods = UNREAD_WORKLOADS.get(kind_of(obj))
        said = f" (its pods: {pods})" if pods else ""
        found.append(
            f"{where}: {label(obj)}: asks GPUs, but rdmaplane does not read a "
            f"{kind_of(obj) or 'kind-less object'}{said}; its pods are not shown here (the "
            "webhook and the extender see them when they are created)"
        )
    return found


@dataclass(frozen=True, slots=True)
class PodTemplate:
    """A pod template of a workload: where it sits (JSON pointer tokens) and its content."""

    path: Path
    template: Mapping[str, Any]

    @property
    def pointer(self) -> str:
        """The RFC 6901 pointer of the template (`/spec/template`; "" for a Pod)."""
        return pointer(*self.path)


def kind_of(obj: Mapping[str, Any]) -> str:
    """`group/Kind` of an object (the core group has none: `Pod`)."""
    version = obj.get("apiVersion")
    group = version.rpartition("/")[0] if isinstance(version, str) else ""
    kind = obj.get("kind")
    kind = kind if isinstance(kind, str) else ""
    return f"{group}/{kind}" if group else kind


def is_workload(obj: object) -> bool:
    """Whether the table knows where this object keeps pod templates."""
    return isinstance(obj, Mapping) and kind_of(obj) in WORKLOADS


def pod_templates(obj: Mapping[str, Any], where: str) -> list[PodTemplate]:
    """Every pod template of a workload the table knows, in path order. `DocumentError`
    naming `where` and the path when the object is not of such a kind, when a path the kind
    always has is missing, or when what sits there is not a pod template."""
    workload = WORKLOADS.get(kind_of(obj))
    if workload is None:
        said = repr(obj.get("kind"))[:60] if obj.get("kind") is not None else "no kind"
        raise DocumentError(
            f"{where}: {said} (apiVersion {str(obj.get('apiVersion'))[:60]!r}) is not a Pod or "
            f"a workload rdmaplane knows ({', '.join(WORKLOADS)})"
        )
    found: list[PodTemplate] = []
    for shape in workload.paths:
        found += _resolve(obj, shape, (), f"{where}: {obj.get('kind')}")
    return found


def manifest_templates(
    objects: list[tuple[str, object]], source: str
) -> list[tuple[dict[str, Any], list[PodTemplate]]]:
    """Each workload among a manifest's objects (`documents.manifest_objects`) with its pod
    templates; `DocumentError` naming `source` and what it holds when there is none."""
    found = [
        (obj, pod_templates(obj, where))
        for where, obj in objects
        if isinstance(obj, dict) and is_workload(obj)
    ]
    if not found:
        held = ", ".join(sorted({label(obj) for _, obj in objects})) or "nothing"
        unread = sorted(
            {kind_of(o) for _, o in objects if isinstance(o, Mapping)} & set(UNREAD_WORKLOADS)
        )
        if unread:
            raise DocumentError(
                f"{source}: no Pod or workload rdmaplane reads ({held}); "
                f"{', '.join(unread)}: its pods are built by its operator, which rdmaplane "
                "does not read (the webhook and the extender see the pods when they are created)"
            )
        raise DocumentError(f"{source}: no Pod or workload with a pod template in it ({held})")
    return found


def label(obj: object, namespace: str | None = None) -> str:
    """`Kind/namespace/name` of an object, as output is keyed and messages name it (two
    `Pod/trainer` of two namespaces are two objects): the namespace given, else the
    object's own; `Kind/name` when it has none (a cluster-scoped object, or one whose
    namespace is set where it is applied)."""
    if not isinstance(obj, Mapping):
        return type(obj).__name__
    meta = _mapping(obj.get("metadata"))
    kind, name = obj.get("kind"), meta.get("name")
    ns = namespace if namespace is not None else meta.get("namespace")
    said = str(kind)[:40] if isinstance(kind, str) and kind else "an object without a kind"
    if not isinstance(name, str) or not name:
        return said
    if isinstance(ns, str) and ns:
        said += f"/{ns[:63]}"
    return f"{said}/{name[:253]}"


def pod_of(obj: Mapping[str, Any], template: PodTemplate) -> dict[str, Any]:
    """The pod a template makes, as far as a scheduler sees it before the pod exists: the
    template's metadata and spec, in the workload's namespace, with the label its controller
    adds naming the workload."""
    if not template.path:
        return dict(obj)
    meta = dict(_mapping(template.template.get("metadata")))
    workload_meta = _mapping(obj.get("metadata"))
    if "namespace" in workload_meta:
        meta["namespace"] = workload_meta["namespace"]
    label = WORKLOADS[kind_of(obj)].group_label
    if label is not None and isinstance(workload_meta.get("name"), str):
        meta["labels"] = {**_mapping(meta.get("labels")), label: workload_meta["name"]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": template.template["spec"]}


def with_template(obj: dict[str, Any], template: Mapping[str, Any]) -> dict[str, Any]:
    """`obj` with `template` as its pod template, for a kind that has exactly one (a Job,
    a Deployment...): what writers of workloads (`doctor job`) build from the same table."""
    (path,) = WORKLOADS[kind_of(obj)].paths
    node = obj
    for token in path[:-1]:
        node = node.setdefault(token, {})
    node[path[-1]] = dict(template)
    return obj


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _resolve(node: object, shape: tuple[str, ...], at: Path, where: str) -> list[PodTemplate]:
    if not shape:
        return [_template(node, at, where)]
    token, rest = shape[0], shape[1:]
    if token == "*":
        items: Iterator[tuple[str | int, object]]
        if isinstance(node, list):
            items = iter(enumerate(node))
        elif isinstance(node, Mapping):
            items = iter(node.items())
        else:
            raise DocumentError(f"{where}: {_pointer(at)}: expected a list or a map")
        return [t for key, child in items for t in _resolve(child, rest, (*at, key), where)]
    if not isinstance(node, Mapping) or token not in node:
        raise DocumentError(f"{where}: {_pointer((*at, token))}: missing; no pod template")
    return _resolve(node[token], rest, (*at, token), where)


def _template(node: object, at: Path, where: str) -> PodTemplate:
    """A pod template as every reader of one relies on: a mapping whose `metadata` (if any)
    is one and whose `spec.containers` is a list."""
    here = _pointer(at) or "the pod"
    if not isinstance(node, Mapping):
        raise DocumentError(f"{where}: {here}: expected a pod template (metadata, spec)")
    if not isinstance(node.get("metadata", {}), Mapping):
        raise DocumentError(f"{where}: {here}/metadata: expected a mapping")
    spec = node.get("spec")
    if not isinstance(spec, Mapping) or not isinstance(spec.get("containers"), list):
        raise DocumentError(f"{where}: {here}/spec/containers: expected a list of containers")
    return PodTemplate(at, node)


def _pointer(at: Path) -> str:
    return PodTemplate(at, {}).pointer
