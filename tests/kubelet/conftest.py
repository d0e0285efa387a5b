"""The kubelet tier: the kubelet's own device manager and Topology Manager as the judge.

Every test under tests/kubelet is marked `kubelet` automatically; `pytest -m "not kubelet"`
leaves them out (`make test-fast` does). The harness binary comes from
`scripts/build-k8s.sh kubelet-harness` (`RDMAPLANE_KUBELET_HARNESS`, set by `make test`); when
it is missing every test here fails with what to run, it never skips.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest

from rdmaplane.adapters.discovery import samples
from tests.kubelet.harness import HarnessMissing, SampleNode, harness_binary, sample_node


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.kubelet)


@pytest.fixture(scope="session", autouse=True)
def kubelet_harness_binary() -> Path:
    try:
        return harness_binary()
    except HarnessMissing as e:
        pytest.fail(str(e), pytrace=False)


@pytest.fixture(scope="session")
def nodes() -> Iterator[dict[str, SampleNode]]:
    """Every bundled sample, materialised once and read back through the real sysfs reader."""
    with ExitStack() as stack:
        yield {name: stack.enter_context(sample_node(name)) for name in samples.names()}
