"""The DRA allocator tier: upstream's allocator as the judge of what a claim costs per node.

Every test under tests/dra_allocator is marked `dra_allocator` automatically; `pytest -m "not
dra_allocator"` leaves them out (`make test-fast` does). The harness binary comes from
`scripts/build-k8s.sh dra-allocator` (`RDMAPLANE_DRA_ALLOCATOR`, set by `make test`); when it
is missing every test here fails with what to run, it never skips.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dra_allocator.harness import HarnessMissing, harness_binary


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.dra_allocator)


@pytest.fixture(scope="session")
def dra_allocator() -> Path:
    try:
        return harness_binary()
    except HarnessMissing as e:
        pytest.fail(str(e), pytrace=False)
