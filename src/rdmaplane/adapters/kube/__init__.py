"""Kubernetes API adapter: lightkube clients and the resource types rdmaplane reads and writes."""

from rdmaplane.adapters.kube.client import KubeconfigError, async_client, load_config, sync_client
from rdmaplane.adapters.kube.resources import ClaimDict, NodeDict, NodeResourceTopology, PodDict

__all__ = [
    "ClaimDict",
    "KubeconfigError",
    "NodeDict",
    "NodeResourceTopology",
    "PodDict",
    "async_client",
    "load_config",
    "sync_client",
]
