"""Resource types that lightkube-models does not ship.

`NodeResourceTopology` is the upstream NRT API (`topology.node.k8s.io/v1alpha2`, cluster-scoped,
one object per node, named after the node); its CRD is `deploy/crds/noderesourcetopology.yaml`.
Objects are generic dicts: `{"metadata": {...}, "attributes": [...], "zones": [...]}`.

`PodDict`, `NodeDict` and `ClaimDict` are core Pods, Nodes and `resource.k8s.io/v1`
ResourceClaims read the same way, as plain dicts, for readers that want dicts anyway (the
scheduler extender's watches, the DRA driver's claim watch): decoded straight from JSON, without
building lightkube's models and converting them back. They are read-only views (list, watch)
and stay out of lightkube's registry, so `codecs` keeps loading the real models.
"""

from __future__ import annotations

from lightkube.generic_resource import (
    GenericGlobalResource,
    GenericNamespacedResource,
    create_api_info,
    create_global_resource,
)

NodeResourceTopology = create_global_resource(
    group="topology.node.k8s.io",
    version="v1alpha2",
    kind="NodeResourceTopology",
    plural="noderesourcetopologies",
)

_READ = ["get", "list", "watch", "global_list", "global_watch"]


class PodDict(GenericNamespacedResource):
    _api_info = create_api_info("", "v1", "Pod", "pods", verbs=_READ)


class NodeDict(GenericGlobalResource):
    _api_info = create_api_info("", "v1", "Node", "nodes", verbs=_READ)


class ClaimDict(GenericNamespacedResource):
    _api_info = create_api_info(
        "resource.k8s.io", "v1", "ResourceClaim", "resourceclaims", verbs=_READ
    )
