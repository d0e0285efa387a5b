"""Resource types that lightkube-models does not ship.

`NodeResourceTopology` is the upstream NRT API (`topology.node.k8s.io/v1alpha2`, cluster-scoped,
one object per node, named after the node); its CRD is `deploy/crds/noderesourcetopology.yaml`.
Objects are generic dicts: `{"metadata": {...}, "attributes": [...], "zones": [...]}`.
"""

from __future__ import annotations

from lightkube.generic_resource import create_global_resource

NodeResourceTopology = create_global_resource(
    group="topology.node.k8s.io",
    version="v1alpha2",
    kind="NodeResourceTopology",
    plural="noderesourcetopologies",
)
