"""What the agent reads from the kubelet's own config file: its Topology Manager settings."""

from __future__ import annotations

from pathlib import Path

from rdmaplane.adapters.documents import DocumentError, read_document
from rdmaplane.core.nrt import POLICIES, SCOPES


def read_kubelet_topology_manager(path: Path) -> tuple[str, str, str | None]:
    """(policy, scope, problem) from the kubelet config file; the kubelet defaults (`none`,
    `container`) when the file or the keys are absent. `problem` says what went wrong, if
    anything, so the caller can log it once."""
    if not path.exists():
        return "none", "container", f"{path} not found; assuming the kubelet defaults"
    try:
        loaded = read_document(path)
    except DocumentError as e:
        return "none", "container", f"{e}; assuming the kubelet defaults"
    conf = loaded if isinstance(loaded, dict) else {}
    policy = conf.get("topologyManagerPolicy", "none")
    scope = conf.get("topologyManagerScope", "container")
    problem = None
    if policy not in POLICIES:
        problem = f"{path}: topologyManagerPolicy {policy!r} unknown; assuming none"
        policy = "none"
    if scope not in SCOPES:
        problem = f"{path}: topologyManagerScope {scope!r} unknown; assuming container"
        scope = "container"
    return str(policy), str(scope), problem
