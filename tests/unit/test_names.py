"""Our names in the Kubernetes API are written once, in `rdmaplane.core.names`, and never
renamed: the values below are the contract (docs/architecture.md, "Contracts"), as literals."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

from rdmaplane.adapters.config.fabric import FabricDoc
from rdmaplane.core import names

SRC = Path(__file__).resolve().parents[2] / "src" / "rdmaplane"
GENERATED = SRC / "adapters" / "kubelet" / "api"


def test_the_contract_names_keep_their_values() -> None:
    assert names.HCA == "rdmaplane.io/hca"
    assert names.HCA_SHARED == "rdmaplane.io/hca-shared"
    assert names.DRA_DRIVER == "rdma.rdmaplane.io"
    assert names.RDMA_LABEL == "rdmaplane.io/rdma"
    assert names.LINK_LAYER_LABEL == "rdmaplane.io/link-layer"
    assert names.GID_INDEX_LABEL == "rdmaplane.io/gid-index"
    assert names.READY_CONDITION == "RDMAReady"
    assert names.FAULT_ANNOTATION == "rdmaplane.io/fault"
    assert names.FAULT_CONDITION == "RDMAFault"
    assert names.UNHEALTHY_TAINT == "rdmaplane.io/rdma-unhealthy"
    assert names.GROUP_LABEL == "rdmaplane.io/group"
    assert names.KV_PEERS == "rdmaplane.io/kv-peers"
    assert names.CONFIG_API_VERSION == "rdmaplane.io/v1alpha1"
    assert names.NODE_TOPOLOGY_SCHEMA == "rdmaplane.io/node-topology/v1"


def test_every_name_is_ours_and_written_once() -> None:
    values = [v for k, v in vars(names).items() if k.isupper()]
    twice = {v for v in values if values.count(v) > 1}
    assert twice == {"rdmaplane.io/rdma"}  # a Node's label, and a pod's annotation
    prefixed = [v for v in values if v != names.DOMAIN and "rdmaplane.io" in v]
    assert all(v.startswith(("rdmaplane.io/", "rdma.rdmaplane.io")) for v in prefixed)


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants that are a name of ours (not prose that mentions one)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text == names.DRA_DRIVER or (text.startswith("rdmaplane.io/") and " " not in text):
                found.append((node.lineno, text))
    return found


def test_src_takes_its_names_from_the_one_module() -> None:
    allowed = {SRC / "core" / "names.py", SRC / "adapters" / "config" / "fabric.py"}
    stray = [
        f"{path.relative_to(SRC)}:{line}: {text}"
        for path in sorted(SRC.rglob("*.py"))
        if path not in allowed and GENERATED not in path.parents
        for line, text in _literals(path)
    ]
    assert not stray, stray


def test_the_fabric_file_literal_is_the_config_api_version() -> None:
    """A `Literal[...]` cannot name a constant; this one is held to it here."""
    hint = typing.get_type_hints(FabricDoc)["api_version"]
    assert typing.get_args(hint) == (names.CONFIG_API_VERSION,)
