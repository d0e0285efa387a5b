"""The extender's prediction against the kubelet's own admission, on random pod sequences.

Every sample node x the four Topology Manager policies x both scopes, on the default resource
names and on others (another GPU vendor, a renamed exclusive pool, the network operator's shared
pool: the node's plugins register them, its agent publishes them); for each, seeded random
sequences of pods (GPUs, exclusive HCAs, shared slots; init containers, sidecars, apps) and
deletions are replayed on an empty node behind the Go harness, and every pod's prediction is
compared with what the kubelet did (`differential.judge`: admission, each container's NUMA
affinity, the NUMA zones of its devices, PCIe pairs within the predicted best). A failure is
shrunk by hypothesis to the shortest sequence that still disagrees.

`RDMAPLANE_DIFF_EXAMPLES` sets the sequences per configuration on the default names (default
25: 1,400 sequences, ~8,000 pods), a fifth as many on the others; `make bench` does not run
this, set it for a larger sweep.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rdmaplane.adapters.discovery import samples
from rdmaplane.core import nrt
from tests import resource_names
from tests.kubelet.differential import Container, Outcome, PodShape, run_sequence
from tests.kubelet.harness import KubeletHarness, SampleNode

EXAMPLES = int(os.environ.get("RDMAPLANE_DIFF_EXAMPLES", "25"))
COUNTS = {  # device counts drawn per container: mostly small, sometimes more than a zone has
    "gpus": (0, 0, 1, 1, 2, 3, 4, 8),
    "hcas": (0, 0, 1, 1, 2, 4),
    "shared": (0, 0, 0, 1, 2),
}


def containers(kind: str) -> st.SearchStrategy[Container]:
    return st.builds(
        Container,
        st.just(kind),
        *(st.sampled_from(COUNTS[k]) for k in ("gpus", "hcas", "shared")),
        zeros=st.sampled_from((False,) * 9 + (True,)),  # now and then `hca: "0"` and the like
    )


@st.composite
def pods(draw: st.DrawFn) -> PodShape:
    init = draw(st.lists(containers("init"), max_size=2))
    sidecars = draw(st.lists(containers("sidecar"), max_size=1))
    apps = draw(st.lists(containers("app"), min_size=1, max_size=3))
    return PodShape((*init, *sidecars, *apps))


# a step admits a pod, or (an int) deletes one of the active pods
steps = st.lists(st.one_of(pods(), pods(), pods(), st.integers(0, 99)), min_size=1, max_size=10)


def _report(outcomes: list[Outcome]) -> str:
    lines = []
    for o in outcomes:
        if o.disagreements:
            lines.append(f"pod {o.shape}: prediction {o.verdict.reason!r}")
            lines += [f"  - {d}" for d in o.disagreements]
    return "\n".join(lines)


@pytest.mark.parametrize("names", ["default", "renamed"])
@pytest.mark.parametrize("scope", nrt.SCOPES)
@pytest.mark.parametrize("policy", nrt.POLICIES)
@pytest.mark.parametrize("sample", samples.names())
def test_prediction_agrees_with_the_kubelet(
    nodes: dict[str, SampleNode], sample: str, policy: str, scope: str, names: str
) -> None:
    renamed = resource_names.NAMES if names == "renamed" else {}
    with KubeletHarness(nodes[sample], policy, scope, names=renamed) as harness:

        @settings(
            max_examples=EXAMPLES if not renamed else max(1, EXAMPLES // 5),
            derandomize=True,  # seeded: the same sequences on every run
            suppress_health_check=[HealthCheck.too_slow],
        )
        @given(steps)
        def agrees(sequence: list[PodShape | int]) -> None:
            outcomes = run_sequence(harness, sequence)
            assert not any(o.disagreements for o in outcomes), _report(outcomes)

        agrees()
