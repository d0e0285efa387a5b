"""The extender over real HTTP on nodes whose resources are not the default names.

Every node's NRT is the one the agent's own code publishes for a bundled sample with an
exclusive and a shared pool side by side (`cli.nrt.agent_nrt`), once on the default names and
once renamed (another GPU vendor, a renamed exclusive pool, the network operator's shared pool).
The renamed cluster must be answered exactly as the default one with the names swapped: the
same nodes pass, for the same reasons, with the same scores, bound pods included. One cluster
holding both kinds of node keeps each pod on its own kind.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from rdmaplane.adapters.config import load
from rdmaplane.adapters.config.base import validate
from rdmaplane.adapters.config.deviceplugin import DEVICE_PLUGIN_CONFIG
from rdmaplane.adapters.discovery import samples
from rdmaplane.cli.nrt import agent_nrt
from rdmaplane.core import nrt
from rdmaplane.core.settings.scheduler import ExtenderSettings
from rdmaplane.services.scheduler.cache import ClusterCache
from rdmaplane.services.scheduler.root import create_app
from tests import resource_names as names
from tests.scheduler_helpers import node, pod, serve

# (sample, policy, scope) per node
NODES = {
    "h200-a": ("hgx-h200-ib", "single-numa-node", "container"),
    "h200-b": ("hgx-h200-ib", "best-effort", "pod"),
    "roce": ("hgx-h100-roce", "restricted", "container"),
    "dgx": ("dgx-a100", "best-effort", "container"),
    "l40s": ("pcie-l40s-split", "single-numa-node", "container"),
}
SHAPES = [(1, 1, 0), (2, 2, 0), (4, 4, 0), (8, 8, 0), (4, 0, 1), (8, 0, 1), (2, 0, 0), (0, 2, 0)]
BOUND = [("h200-a", 3, 3, 0), ("h200-b", 2, 0, 1), ("dgx", 4, 4, 0), ("l40s", 1, 1, 0)]


def _nrts(tmp_path: Path, renamed: bool) -> list[dict[str, Any]]:
    config = names.plugin_config(
        tmp_path / f"plugin-{renamed}.yaml", names.NAMES if renamed else None
    )
    plugin = load(config, DEVICE_PLUGIN_CONFIG)
    gpu = names.GPU if renamed else nrt.GPU
    return [
        agent_nrt(samples.read_sample(sample), name, plugin, policy, scope, gpu_resource=gpu)
        for name, (sample, policy, scope) in NODES.items()
    ]


def _pods(renamed: bool, prefix: str = "") -> list[dict[str, Any]]:
    pods = [pod(f"{prefix}bound-{i}", *shape, node=n) for i, (n, *shape) in enumerate(BOUND)]
    return [names.renamed(p) if renamed else p for p in pods]


def _cache(nrts: list[dict[str, Any]], pods: list[dict[str, Any]], **config: Any) -> ClusterCache:
    cache = ClusterCache.configured(validate(ExtenderSettings, config))
    cache.replace("nrt", nrts)
    cache.replace("node", [node(o["metadata"]["name"]) for o in nrts])
    cache.replace("pod", pods)
    return cache


@pytest.fixture(scope="module")
def clusters(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str, str]]:
    """Base URLs of the extender on the default cluster, on the renamed one, and on both
    together (names prefixed `r-` there for the renamed nodes), configured with every name:
    a node then refuses a pod for the resources it lacks rather than take it for a pod that
    asks for no device (kube-scheduler's own fit check would refuse it too)."""
    tmp = tmp_path_factory.mktemp("names")
    default, renamed = _nrts(tmp, False), _nrts(tmp, True)
    prefixed = [{**o, "metadata": {"name": "r-" + o["metadata"]["name"]}} for o in renamed]
    mixed_pods = _pods(False) + [
        {**p, "spec": {**p["spec"], "nodeName": "r-" + p["spec"]["nodeName"]}}
        for p in _pods(True, "r-")
    ]
    both = {"resources": {"gpu": [nrt.GPU, names.GPU], "hca": [nrt.HCA, names.HCA],
                          "hcaShared": [nrt.HCA_SHARED, names.SHARED]}}  # fmt: skip
    config = ExtenderSettings()
    with (
        serve(create_app(_cache(default, _pods(False)), config)) as a,
        serve(create_app(_cache(renamed, _pods(True)), config)) as b,
        serve(create_app(_cache(default + prefixed, mixed_pods, **both), config)) as c,
    ):
        yield a, b, c


def _ask(url: str, shape: tuple[int, int, int], renamed: bool, nodes: list[str]) -> Any:
    asked = pod("p", *shape)
    asked = names.renamed(asked) if renamed else asked
    args = {"Pod": asked, "NodeNames": nodes}
    filtered = httpx.post(f"{url}/filter", content=orjson.dumps(args)).json()
    passed = {"Pod": asked, "NodeNames": filtered["NodeNames"]}
    scores = httpx.post(f"{url}/prioritize", content=orjson.dumps(passed)).json()
    return filtered, scores


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_renamed_nodes_are_answered_as_the_default_ones(
    clusters: tuple[str, str, str], shape: tuple[int, int, int]
) -> None:
    default, renamed, _ = clusters
    on_default = _ask(default, shape, False, list(NODES))
    on_renamed = _ask(renamed, shape, True, list(NODES))
    assert on_renamed == names.renamed(on_default)


def test_the_shapes_pass_and_fail_somewhere(clusters: tuple[str, str, str]) -> None:
    """What the comparisons stand on: each shape passes some node or fails for a reason."""
    answers = [_ask(clusters[0], shape, False, list(NODES))[0] for shape in SHAPES]
    assert sum(len(a["NodeNames"]) for a in answers) > len(SHAPES)
    assert all(a["FailedNodes"] or a["FailedAndUnresolvableNodes"] for a in answers[2:4])


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_one_cluster_with_both_keeps_each_pod_on_its_own_nodes(
    clusters: tuple[str, str, str], shape: tuple[int, int, int]
) -> None:
    default, _, mixed = clusters
    every = [*NODES, *(f"r-{n}" for n in NODES)]
    alone, _ = _ask(default, shape, False, list(NODES))
    for renamed in (False, True):
        filtered, _ = _ask(mixed, shape, renamed, every)
        mine = [
            n.removeprefix("r-") for n in filtered["NodeNames"] if n.startswith("r-") == renamed
        ]
        assert mine == alone["NodeNames"] and len(filtered["NodeNames"]) == len(mine)
        others = filtered["FailedAndUnresolvableNodes"]
        first = next(r for r, n in zip((nrt.GPU, nrt.HCA, nrt.HCA_SHARED), shape, strict=True) if n)
        wanted = names.NAMES[first] if renamed else first
        strangers = [n for n in every if n.startswith("r-") != renamed]
        assert all(others[n] == f"rdmaplane: insufficient {wanted}" for n in strangers), others
